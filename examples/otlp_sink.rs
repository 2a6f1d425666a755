//! A minimal OTLP/gRPC trace collector that counts the spans it is sent and
//! keeps none: the live receiver for measuring tracing's cost
//! (`scripts/bench.sh` with `HANDOFF_OTEL__ENDPOINT` set, docs/performance.md "Tracing").
//!
//! ```text
//! cargo run --release --example otlp_sink -- --listen 127.0.0.1:4317
//! ```
//!
//! Prints `otlp_sink: listening on ADDR` once bound, a count every 10 s
//! while spans arrive, and the total on SIGTERM or Ctrl-C.

use clap::Parser;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Parser)]
struct Args {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:4317")]
    listen: std::net::SocketAddr,
}

#[derive(Clone, Default)]
struct Count {
    spans: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl TraceService for Count {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let n: usize = request
            .get_ref()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.spans.fetch_add(n as u64, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!("otlp_sink: listening on {}", listener.local_addr()?);
    let count = Count::default();
    let report = count.clone();
    tokio::spawn(async move {
        let mut last = 0;
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let now = report.spans.load(Ordering::Relaxed);
            if now != last {
                eprintln!("otlp_sink: {now} spans");
                last = now;
            }
        }
    });
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(count.clone()))
        .serve_with_incoming_shutdown(incoming, stop)
        .await?;
    eprintln!(
        "otlp_sink: total {} spans in {} requests",
        count.spans.load(Ordering::Relaxed),
        count.requests.load(Ordering::Relaxed)
    );
    Ok(())
}
