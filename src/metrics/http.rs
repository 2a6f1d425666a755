//! A minimal HTTP/1.1 responder for three read-only endpoints: pure, so every
//! garbage request is tested without a socket. `GET` and `HEAD` only; every
//! response closes the connection.
//!
//! Not on `hyper` (in the tree for the OTLP exporter): two answers that
//! `tests/server/metrics.rs` requires differ there (hyper 1.x,
//! `proto/h1/conn.rs` and `role.rs`). A head cut short by the client's close
//! gets the answer to what arrived here, and no answer from hyper (an
//! "incomplete message" error closes the connection); a head of only blank
//! lines gets a 400 at once here, while hyper skips blank lines before a
//! request line (RFC 9112 section 2.2) and waits for one until the I/O
//! timeout.

use super::{CONTENT_TYPE, Metrics, Readiness};

/// The longest request head (request line and headers) read, in bytes.
pub(super) const MAX_HEAD_BYTES: usize = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Method {
    Get,
    Head,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

impl Response {
    fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            content_type: TEXT,
            body: format!("{body}\n"),
        }
    }

    fn reason(&self) -> &'static str {
        match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
            _ => "Unknown",
        }
    }

    /// The bytes on the wire; `HEAD` gets the headers (with the length the
    /// body would have) and no body.
    pub fn to_bytes(&self, method: Option<Method>) -> Vec<u8> {
        let allow = if self.status == 405 {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        };
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            self.status,
            self.reason(),
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        if method != Some(Method::Head) {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

/// Where the request head ends (just past the blank line), if it has.
pub(super) fn head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The method and path (query string removed) of a request head.
pub(super) fn parse_request_line(head: &[u8]) -> Result<(Method, &str), Response> {
    let bad = |why: &str| Response::text(400, why);
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = std::str::from_utf8(line).map_err(|_| bad("the request line is not valid UTF-8"))?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(
            "expected a request line like \"GET /metrics HTTP/1.1\"",
        ));
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(bad("only HTTP/1.0 and HTTP/1.1 are served"));
    }
    if !target.starts_with('/') {
        return Err(bad("the request target must be a path starting with /"));
    }
    let method = match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        _ => {
            return Err(Response::text(405, "only GET and HEAD are served"));
        }
    };
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Ok((method, path))
}

/// The response for a path.
pub(super) fn route(path: &str, metrics: &Metrics, readiness: &Readiness) -> Response {
    match path {
        "/metrics" => Response {
            status: 200,
            content_type: CONTENT_TYPE,
            body: metrics.encode(),
        },
        "/healthz" => Response::text(200, "ok"),
        "/readyz" => {
            let report = readiness.report();
            Response {
                status: if report.ready() { 200 } else { 503 },
                content_type: JSON,
                body: format!("{}\n", report.to_json()),
            }
        }
        _ => Response::text(404, "not found; try /metrics, /healthz or /readyz"),
    }
}

/// The bytes to answer a complete (or cut-off) request head with.
pub(super) fn respond(head: &[u8], metrics: &Metrics, readiness: &Readiness) -> Vec<u8> {
    match parse_request_line(head) {
        Ok((method, path)) => route(path, metrics, readiness).to_bytes(Some(method)),
        Err(response) => response.to_bytes(None),
    }
}

/// The answer to a head longer than [`MAX_HEAD_BYTES`].
pub(super) fn too_large() -> Vec<u8> {
    Response::text(431, "the request head is larger than 8 KiB").to_bytes(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use crate::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout};

    #[test]
    fn request_lines() {
        use Method::*;
        // (request head, Ok((method, path)) or Err(status))
        type Case = (&'static [u8], Result<(Method, &'static str), u16>);
        let cases: [Case; 14] = [
            (b"GET /metrics HTTP/1.1\r\n\r\n", Ok((Get, "/metrics"))),
            (b"HEAD /readyz HTTP/1.0\r\n\r\n", Ok((Head, "/readyz"))),
            (
                b"GET /healthz?verbose=1 HTTP/1.1\n\n",
                Ok((Get, "/healthz")),
            ),
            (b"GET /metrics#x HTTP/1.1\r\n\r\n", Ok((Get, "/metrics"))),
            (b"POST /metrics HTTP/1.1\r\n\r\n", Err(405)),
            (b"get /metrics HTTP/1.1\r\n\r\n", Err(405)),
            (b"GET /metrics HTTP/2.0\r\n\r\n", Err(400)),
            (b"GET /metrics\r\n\r\n", Err(400)),
            (b"GET  /metrics HTTP/1.1\r\n\r\n", Err(400)),
            (b"GET http://x/metrics HTTP/1.1\r\n\r\n", Err(400)),
            (b"\xff\xfe GET / HTTP/1.1\r\n\r\n", Err(400)),
            (b"", Err(400)),
            (b"\r\n\r\n", Err(400)),
            (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", Err(400)),
        ];
        for (head, want) in cases {
            let got = parse_request_line(head).map_err(|r| r.status);
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn head_ends_at_the_first_blank_line() {
        let cases: [(&[u8], Option<usize>); 5] = [
            (b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody", Some(27)),
            (b"GET / HTTP/1.1\n\n", Some(16)),
            (b"GET / HTTP/1.1\r\nHost: x\r\n", None),
            (b"", None),
            (b"\r\n\r\n", Some(4)),
        ];
        for (buf, want) in cases {
            assert_eq!(head_end(buf), want, "{:?}", String::from_utf8_lossy(buf));
        }
    }

    #[test]
    fn routes_and_wire_format() {
        let metrics = Metrics::new();
        let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
        let readiness = Readiness::new(identity.watch());
        let answer = |head: &[u8]| String::from_utf8(respond(head, &metrics, &readiness)).unwrap();

        let ok = answer(b"GET /healthz HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("Content-Length: 3\r\n"), "{ok}");
        assert!(ok.contains("Connection: close\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nok\n"), "{ok}");

        let head = answer(b"HEAD /healthz HTTP/1.1\r\n\r\n");
        assert!(head.contains("Content-Length: 3\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "{head}");

        let scrape = answer(b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(scrape.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(scrape.contains("handoff_outputs_total{outcome=\"decode\"} 0\n"));

        let not_ready = answer(b"GET /readyz HTTP/1.1\r\n\r\n");
        assert!(not_ready.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(not_ready.contains("\"slot_held\""), "{not_ready}");

        assert!(answer(b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        let post = answer(b"DELETE /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 "));
        assert!(post.contains("Allow: GET, HEAD\r\n"));
        assert!(answer(b"garbage").starts_with("HTTP/1.1 400 "));
    }
}
