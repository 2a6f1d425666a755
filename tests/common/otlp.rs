//! A real OTLP trace receiver on a free loopback port, recording every span
//! it is sent: over gRPC the collector's own service
//! (`opentelemetry.proto.collector.trace.v1.TraceService`, built from the
//! `opentelemetry-proto` definitions), over HTTP `POST /v1/traces` with the
//! same protobuf body. And a collector that accepts connections and never
//! answers.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A span as received, with IDs in lowercase hex.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub attributes: BTreeMap<String, Attr>,
    pub events: Vec<String>,
    /// The status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
    /// `service.name` of the resource that sent it.
    pub service: String,
}

/// An attribute's value, as the tests compare them.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    Str(String),
    Int(i64),
    Bool(bool),
    Other,
}

impl ReceivedSpan {
    pub fn str(&self, key: &str) -> Option<&str> {
        match self.attributes.get(key) {
            Some(Attr::Str(s)) => Some(s),
            _ => None,
        }
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        match self.attributes.get(key) {
            Some(Attr::Int(n)) => Some(*n),
            _ => None,
        }
    }
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<ReceivedSpan>>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.record(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Sink {
    fn record(&self, request: ExportTraceServiceRequest) {
        let mut got = Vec::new();
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                let attributes = span
                    .attributes
                    .iter()
                    .map(|kv| {
                        let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(Value::StringValue(s)) => Attr::Str(s.clone()),
                            Some(Value::IntValue(n)) => Attr::Int(*n),
                            Some(Value::BoolValue(b)) => Attr::Bool(*b),
                            _ => Attr::Other,
                        };
                        (kv.key.clone(), value)
                    })
                    .collect();
                got.push(ReceivedSpan {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes,
                    events: span.events.into_iter().map(|e| e.name).collect(),
                    status: span.status.map_or(0, |s| s.code),
                    service: service.clone(),
                });
            }
        }
        self.0.lock().unwrap().extend(got);
    }
}

/// One OTLP/HTTP connection: requests with a `Content-Length` body, each a
/// protobuf `ExportTraceServiceRequest`, answered 200 with an empty
/// protobuf `ExportTraceServiceResponse`.
async fn serve_http(mut stream: tokio::net::TcpStream, sink: Sink) {
    use prost::Message as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buffer.drain(..head_end + length).skip(head_end).collect();
        let status = match ExportTraceServiceRequest::decode(body.as_slice()) {
            Ok(request) if head.starts_with("post /v1/traces ") => {
                sink.record(request);
                "200 OK"
            }
            _ => "400 Bad Request",
        };
        let reply = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
        );
        if stream.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The receiver; stops when dropped. Start it inside a tokio runtime.
pub struct OtlpReceiver {
    /// `http://127.0.0.1:PORT`, for `otel.endpoint`.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the OTLP receiver");
        let port = listener.local_addr().expect("local addr").port();
        let sink = Sink::default();
        let spans = Arc::clone(&sink.0);
        let incoming = tokio_stream_listener(listener);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(sink))
                .serve_with_incoming(incoming)
                .await;
        });
        OtlpReceiver {
            endpoint: format!("http://127.0.0.1:{port}"),
            spans,
            task,
        }
    }

    /// The same receiver over OTLP/HTTP (protobuf): `endpoint` is its base
    /// URL, to which `/v1/traces` is added.
    pub async fn start_http() -> OtlpReceiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the OTLP/HTTP receiver");
        let port = listener.local_addr().expect("local addr").port();
        let sink = Sink::default();
        let spans = Arc::clone(&sink.0);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_http(stream, sink.clone()));
            }
        });
        OtlpReceiver {
            endpoint: format!("http://127.0.0.1:{port}"),
            spans,
            task,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until `done` holds for the spans received (at most
    /// `timeout`); the spans received by then.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        super::poll_until(timeout, || async { done(&self.spans()) }).await;
        self.spans()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The accepted connections of a listener, as the stream tonic serves.
fn tokio_stream_listener(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}

/// A collector that is there and never answers: it accepts TCP connections
/// and holds them without reading. Stops when dropped.
pub struct HungCollector {
    pub endpoint: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HungCollector {
    pub fn start() -> HungCollector {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => held.push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        HungCollector {
            endpoint: format!("http://127.0.0.1:{port}"),
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HungCollector {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
