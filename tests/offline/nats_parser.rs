//! The patched async-nats parser (vendor/async-nats, docs/vendor-async-nats.md):
//! what the server sends is parsed into ops or an error, never a panic.
//! Driven through the crate's fuzz hook, with no socket.

use async_nats::connection::parse_server_ops;
use async_nats::header::HEADER_BLOCK_ERROR;
use async_nats::{HeaderMap, ServerOp, StatusCode};

#[test]
fn the_fuzz_hook_parses_server_ops_without_a_socket() {
    let ops = parse_server_ops(b"PING\r\n+OK\r\nMSG a.b 7 5\r\nhello\r\nPONG\r\n")
        .expect("well-formed ops parse");
    assert_eq!(ops.len(), 4);
    assert_eq!(ops[0], ServerOp::Ping);
    assert_eq!(ops[1], ServerOp::Ok);
    let ServerOp::Message {
        sid,
        subject,
        payload,
        ..
    } = &ops[2]
    else {
        panic!("expected a message, got {:?}", ops[2]);
    };
    assert_eq!(
        (*sid, subject.as_str(), &payload[..]),
        (7, "a.b", &b"hello"[..])
    );
    assert_eq!(ops[3], ServerOp::Pong);
}

#[test]
fn an_incomplete_trailing_op_is_left_unparsed() {
    let ops = parse_server_ops(b"PING\r\nMSG a.b 7 5\r\nhel").expect("no error");
    assert_eq!(ops, vec![ServerOp::Ping]);
}

/// The inputs of nats-io/nats.rs PR #1612 that panicked the connection task
/// of async-nats 0.51.0 and are protocol errors instead.
#[test]
fn protocol_errors_are_errors_not_panics() {
    let max = usize::MAX;
    let cases: [(&str, Vec<u8>); 4] = [
        ("a bare -ERR", b"-ERR\r\n".to_vec()),
        (
            "a MSG length of usize::MAX",
            format!("MSG a 1 {max}\r\n").into_bytes(),
        ),
        (
            "a MSG length that overflows with the control line",
            format!("MSG a 1 {}\r\n", max - 3).into_bytes(),
        ),
        (
            "an HMSG total length of usize::MAX",
            format!("HMSG a 1 12 {max}\r\nNATS/1.0\r\n\r\n\r\n").into_bytes(),
        ),
    ];
    for (what, bytes) in cases {
        let outcome = std::panic::catch_unwind(|| parse_server_ops(&bytes));
        match outcome {
            Ok(Err(_)) => {}
            Ok(Ok(ops)) => panic!("{what}: parsed as {ops:?}, expected an error"),
            Err(_) => panic!("{what}: the parser panicked"),
        }
    }
}

/// An `HMSG` on subject `s`, sid 1, reply `r`, with `block` as its header
/// block and `body` as its payload.
fn hmsg(block: &[u8], body: &[u8]) -> Vec<u8> {
    let mut op = format!(
        "HMSG s 1 r {} {}\r\n",
        block.len(),
        block.len() + body.len()
    )
    .into_bytes();
    op.extend_from_slice(block);
    op.extend_from_slice(body);
    op.extend_from_slice(b"\r\n");
    op
}

/// The one message parsed from `bytes`, as (headers, status, payload).
fn one_message(bytes: &[u8]) -> (HeaderMap, Option<StatusCode>, Vec<u8>) {
    let ops = match std::panic::catch_unwind(|| parse_server_ops(bytes)) {
        Ok(Ok(ops)) => ops,
        Ok(Err(e)) => panic!("error instead of a message: {e}"),
        Err(_) => panic!("the parser panicked"),
    };
    let [
        ServerOp::Message {
            headers,
            status,
            payload,
            subject,
            reply,
            ..
        },
    ] = &ops[..]
    else {
        panic!("expected one message, got {ops:?}");
    };
    // Subject and reply still arrive: a JetStream message must stay ackable.
    assert_eq!(subject.as_str(), "s");
    assert_eq!(reply.as_ref().map(|r| r.as_str()), Some("r"));
    let headers = headers.clone().expect("an HMSG has headers");
    (headers, *status, payload.to_vec())
}

#[test]
fn an_unparsable_header_block_is_delivered_marked_with_why() {
    let cases: [(&str, &[u8], &str); 8] = [
        (
            "a lone CR in a value",
            b"NATS/1.0\r\nX-Evil: a\rb\r\n\r\n",
            "value of header X-Evil",
        ),
        (
            "a line without a colon",
            b"NATS/1.0\r\nno colon here\r\n\r\n",
            "has no `:`",
        ),
        (
            "a space in a name",
            b"NATS/1.0\r\nBad Name: v\r\n\r\n",
            "header name \"Bad Name\"",
        ),
        (
            "bytes that are not UTF-8",
            b"NATS/1.0\r\nX: \xff\xfe\r\n\r\n",
            "utf-8",
        ),
        ("no version line", b"HTTP/1.1\r\nX: v\r\n\r\n", "NATS/1.0"),
        (
            "a status that is no number",
            b"NATS/1.0 abc\r\n\r\n",
            "status",
        ),
        (
            "the marker itself, forged",
            b"NATS/1.0\r\nAsync-Nats-Header-Block-Error: all fine\r\n\r\n",
            "reserved",
        ),
        (
            "the marker forged in another case, beside a trace header",
            b"NATS/1.0\r\ntraceparent: t\r\nasync-nats-header-block-error: x\r\n\r\n",
            "reserved",
        ),
    ];
    for (what, block, reason) in cases {
        let (headers, status, payload) = one_message(&hmsg(block, b"\x80"));
        let why = headers
            .get(HEADER_BLOCK_ERROR)
            .unwrap_or_else(|| panic!("{what}: no marker in {headers:?}"))
            .as_str();
        assert!(
            why.contains(reason),
            "{what}: reason {why:?} lacks {reason:?}"
        );
        assert!(!why.contains(['\r', '\n']), "{what}: {why:?}");
        assert_eq!(
            headers.iter().count(),
            1,
            "{what}: only the marker: {headers:?}"
        );
        assert_eq!(status, None, "{what}");
        assert_eq!(payload, b"\x80", "{what}: the payload arrives intact");
    }
}

#[test]
fn a_well_formed_header_block_has_no_marker() {
    let block = b"NATS/1.0\r\nContent-Type: application/json\r\nX-Two: a\r\nX-Two: b\r\n\r\n";
    let (headers, status, payload) = one_message(&hmsg(block, b"{}"));
    assert_eq!(headers.get(HEADER_BLOCK_ERROR), None);
    assert_eq!(
        headers.get("Content-Type").map(|v| v.as_str()),
        Some("application/json")
    );
    assert_eq!(headers.get_all("X-Two").count(), 2);
    assert_eq!((status, payload), (None, b"{}".to_vec()));

    let (headers, status, _) = one_message(&hmsg(b"NATS/1.0 503\r\n\r\n", b""));
    assert_eq!(headers.get(HEADER_BLOCK_ERROR), None);
    assert_eq!(status, Some(StatusCode::NO_RESPONDERS));
}

/// The `MSG` and `HMSG` lines are split and their numbers read on bytes
/// (the patch's `parse_decimal`), accepting what `str::parse` accepted.
#[test]
fn message_lines_are_read_as_str_parse_read_them() {
    let message = |bytes: &[u8]| match parse_server_ops(bytes) {
        Ok(ops) => match ops.as_slice() {
            [
                ServerOp::Message {
                    sid,
                    subject,
                    reply,
                    payload,
                    ..
                },
            ] => Ok((
                *sid,
                subject.to_string(),
                reply.as_ref().map(|r| r.to_string()),
                payload.to_vec(),
            )),
            other => panic!("one message expected, got {other:?}"),
        },
        Err(e) => Err(e.to_string()),
    };
    let ok = |sid: u64, subject: &str, reply: Option<&str>| {
        Ok((
            sid,
            subject.to_string(),
            reply.map(str::to_string),
            b"hi".to_vec(),
        ))
    };
    assert_eq!(message(b"MSG a.b 7 2\r\nhi\r\n"), ok(7, "a.b", None));
    assert_eq!(
        message(b"MSG a.b 7 r.1 2\r\nhi\r\n"),
        ok(7, "a.b", Some("r.1"))
    );
    assert_eq!(message(b"MSG  a.b  +7   2\r\nhi\r\n"), ok(7, "a.b", None));
    assert_eq!(
        message(b"MSG a.b 18446744073709551615 +2\r\nhi\r\n"),
        ok(u64::MAX, "a.b", None)
    );
    // The longest number read without checked arithmetic, and one longer.
    assert_eq!(
        message(b"MSG a.b 9999999999999999999 2\r\nhi\r\n"),
        ok(9_999_999_999_999_999_999, "a.b", None)
    );
    assert_eq!(
        message(b"MSG a.b 10000000000000000000 2\r\nhi\r\n"),
        ok(10_000_000_000_000_000_000, "a.b", None)
    );
    // Subjects are UTF-8, whatever bytes they hold besides the separator.
    assert_eq!(
        message("MSG a.\u{e9}\u{a0}b 0 2\r\nhi\r\n".as_bytes()),
        ok(0, "a.\u{e9}\u{a0}b", None)
    );
    for bad in [
        &b"MSG a.b 18446744073709551616 2\r\nhi\r\n"[..],
        b"MSG a.b 7a 2\r\nhi\r\n",
        b"MSG a.b -7 2\r\nhi\r\n",
        b"MSG a.b + 2\r\nhi\r\n",
        b"MSG a.b 7 2x\r\nhi\r\n",
        b"MSG a.b 7 ++2\r\nhi\r\n",
        b"MSG a.\xff 7 2\r\nhi\r\n",
        b"MSG a.b 7 r.\xc3 2\r\nhi\r\n",
        b"MSG a.b\t7 2\r\nhi\r\n",
    ] {
        assert!(message(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }

    let block = b"NATS/1.0\r\nA: b\r\n\r\n";
    let hmsg = |args: &str| {
        let mut bytes = format!("HMSG {args}\r\n").into_bytes();
        bytes.extend_from_slice(block);
        bytes.extend_from_slice(b"hi\r\n");
        message(&bytes)
    };
    let (h, t) = (block.len(), block.len() + 2);
    assert_eq!(hmsg(&format!("a.b 9 {h} {t}")), ok(9, "a.b", None));
    assert_eq!(
        hmsg(&format!("a.b\t9 r.2 {h}  {t}")),
        ok(9, "a.b", Some("r.2"))
    );
    assert_eq!(hmsg(&format!("a.b +9 +{h} +{t}")), ok(9, "a.b", None));
    // Only ASCII whitespace separates (the server splits nothing else).
    assert_eq!(
        hmsg(&format!("a.\u{a0}b 9 {h} {t}")),
        ok(9, "a.\u{a0}b", None)
    );
    for bad in [
        format!("a.b x9 {h} {t}"),
        format!("a.b 9 {h}x {t}"),
        format!("a.b 9 {h} {t}0000000000000000000000"),
        format!("a.b 9 {t} {h}"),
    ] {
        assert!(hmsg(&bad).is_err(), "{bad:?}");
    }
}

/// The publish line is written without the formatting machinery (the
/// patch's `Decimal`): the same bytes as `format!` gives, for every kind of
/// publish and numbers of every width.
#[test]
fn publish_lines_are_the_bytes_format_would_write() {
    use async_nats::connection::publish_bytes;
    use bytes::Bytes;
    for len in [0usize, 1, 9, 10, 99, 100, 4095, 4096, 65_536, 1 << 20] {
        let payload = Bytes::from(vec![b'x'; len]);
        let mut want = format!("PUB a.b {len}\r\n").into_bytes();
        want.extend_from_slice(&payload);
        want.extend_from_slice(b"\r\n");
        assert_eq!(
            publish_bytes("a.b", None, None, payload.clone()),
            want,
            "{len}"
        );

        let mut want = format!("PUB a.b _INBOX.r {len}\r\n").into_bytes();
        want.extend_from_slice(&payload);
        want.extend_from_slice(b"\r\n");
        assert_eq!(
            publish_bytes("a.b", Some("_INBOX.r"), None, payload.clone()),
            want
        );

        let block = b"NATS/1.0\r\nNats-Msg-Id: handoff-r1\r\n\r\n";
        let headers = HeaderMap::from_wire(Bytes::from_static(block));
        let total = block.len() + len;
        let mut want = format!("HPUB gen.jobs {} {total}\r\n", block.len()).into_bytes();
        want.extend_from_slice(block);
        want.extend_from_slice(&payload);
        want.extend_from_slice(b"\r\n");
        assert_eq!(
            publish_bytes("gen.jobs", None, Some(headers), payload.clone()),
            want
        );

        // An empty map publishes without headers.
        assert_eq!(
            publish_bytes("a.b", None, Some(HeaderMap::new()), payload.clone())[..3],
            *b"PUB"
        );
    }
}

/// The publish subject check's shortcut (no byte at or below a space) gives
/// the answer of the two searches it stands before, for every byte at every
/// position of subjects up to 24 bytes.
#[test]
fn the_publish_subject_check_refuses_exactly_the_framing_bytes() {
    use async_nats::connection::valid_publish_subject;
    assert!(!valid_publish_subject(""));
    for len in 1..=24 {
        for at in 0..len {
            for byte in 0u8..=0x7f {
                let mut subject = vec![b'a'; len];
                subject[at] = byte;
                let subject = String::from_utf8(subject).unwrap();
                let framing = matches!(byte, b' ' | b'\t' | b'\r' | b'\n');
                assert_eq!(valid_publish_subject(&subject), !framing, "{subject:?}");
            }
            // Non-ASCII around it changes nothing.
            let mut subject = "\u{e9}".repeat(len);
            subject.insert(at.min(subject.len()) / 2 * 2, ' ');
            assert!(!valid_publish_subject(&subject), "{subject:?}");
        }
    }
}

/// The line end is found as `memmem::find(buf, b"\r\n")` found it, over
/// every arrangement of CR, LF and another byte up to 7 bytes long.
#[test]
fn the_line_end_is_the_first_crlf() {
    use async_nats::connection::crlf_at;
    for len in 0..=7u32 {
        for mut code in 0..3u32.pow(len) {
            let buf: Vec<u8> = (0..len)
                .map(|_| {
                    let b = [b'\r', b'\n', b'a'][(code % 3) as usize];
                    code /= 3;
                    b
                })
                .collect();
            let want = buf.windows(2).position(|w| w == b"\r\n");
            assert_eq!(crlf_at(&buf), want, "{buf:?}");
        }
    }
    // A stray CR or LF in a line is part of it.
    let ops = parse_server_ops(b"MSG a\rb\nc 7 2\r\nhi\r\n").expect("parses");
    let [ServerOp::Message { subject, .. }] = ops.as_slice() else {
        panic!("one message expected, got {ops:?}");
    };
    assert_eq!(subject.as_str(), "a\rb\nc");
}
