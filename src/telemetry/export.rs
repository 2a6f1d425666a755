//! From a finished span to the collector, bounded: a queue of at most
//! `otel.queue_spans` spans, one export at a time, every span not exported
//! counted in `handoff_otel_spans_dropped_total`.
//!
//! Why not the SDK's `BatchSpanProcessor`: it counts what it drops but keeps
//! the count private (logged once at shutdown), and it exports from a
//! thread of its own through `futures::executor::block_on`, outside the
//! tokio runtime the gRPC client needs. Here the queue is a tokio channel
//! whose `try_send` never waits, so a dead or slow collector costs the hot
//! path one failed `try_send` and a counter, never a wait and never memory
//! beyond the queue; the export task is an ordinary task on the runtime.

use crate::metrics::{Metrics, RateLimitedLog, SpanDrop};
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Spans sent to the collector in one request, at most (the SDK's default
/// batch size).
pub const MAX_BATCH: usize = 512;
/// How long a span waits for others to share its request: under load a
/// batch fills first, and at a trickle every span is out within this.
pub const BATCH_DELAY: Duration = Duration::from_millis(500);

/// The SDK's hook at span end: hands the span to the export queue, or
/// counts it dropped. Clonable: both tracers of one worker share the queue.
#[derive(Debug, Clone)]
pub struct QueueProcessor {
    queue: mpsc::Sender<SpanData>,
    drops: DropCount,
}

/// The metrics handle, wrapped for the SDK's `Debug` bound.
#[derive(Clone)]
struct DropCount(Metrics);

impl std::fmt::Debug for DropCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        // Full: this span is dropped, never waited for. Closed: the worker
        // is stopping (the export task is gone); nothing to count then.
        if let Err(mpsc::error::TrySendError::Full(_)) = self.queue.try_send(span) {
            self.drops.0.otel_spans_dropped(SpanDrop::QueueFull, 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        // The export task owns the end (`Exporter::shutdown`).
        Ok(())
    }
}

/// The export task and the way to stop it.
pub struct Exporter {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// Starts the export task on the current runtime; spans given to the
/// returned processor go to `exporter`.
pub fn start<E>(
    exporter: E,
    queue_spans: usize,
    timeout: Duration,
    metrics: Metrics,
) -> (QueueProcessor, Exporter)
where
    E: SpanExporter + 'static,
{
    let (queue, spans) = mpsc::channel(queue_spans.max(1));
    let (stop, stopped) = oneshot::channel();
    let processor = QueueProcessor {
        queue,
        drops: DropCount(metrics.clone()),
    };
    let task = tokio::spawn(export_loop(exporter, spans, stopped, timeout, metrics));
    (
        processor,
        Exporter {
            stop: Some(stop),
            task,
        },
    )
}

impl Exporter {
    /// Exports what is queued (what fits in `budget`), then stops. Spans
    /// ended after this (the identity's last fence) are not exported.
    pub async fn shutdown(mut self, budget: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(budget, &mut self.task).await.is_err() {
            self.task.abort();
            tracing::warn!(
                ?budget,
                "shutdown: the spans still queued could not be exported in time"
            );
        }
    }
}

async fn export_loop<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    mut stopped: oneshot::Receiver<()>,
    timeout: Duration,
    metrics: Metrics,
) {
    let failures = RateLimitedLog::default();
    let mut batch: Vec<SpanData> = Vec::with_capacity(MAX_BATCH);
    loop {
        // Wait for a first span (or the end).
        let first = tokio::select! {
            span = spans.recv() => span,
            _ = &mut stopped => None,
        };
        let Some(first) = first else { break };
        batch.push(first);
        let deadline = tokio::time::Instant::now() + BATCH_DELAY;
        while batch.len() < MAX_BATCH {
            let room = MAX_BATCH - batch.len();
            tokio::select! {
                n = spans.recv_many(&mut batch, room) => if n == 0 { break },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        export(&exporter, &mut batch, timeout, &metrics, &failures).await;
    }
    // Stopping: what is queued now goes out, in batches; new spans are refused.
    spans.close();
    while spans.recv_many(&mut batch, MAX_BATCH).await > 0 {
        export(&exporter, &mut batch, timeout, &metrics, &failures).await;
    }
    if let Err(e) = exporter.shutdown_with_timeout(timeout) {
        tracing::debug!(error = %e, "the OTLP exporter did not shut down cleanly");
    }
}

/// One request to the collector; the batch is emptied either way.
async fn export<E: SpanExporter>(
    exporter: &E,
    batch: &mut Vec<SpanData>,
    timeout: Duration,
    metrics: &Metrics,
    failures: &RateLimitedLog,
) {
    let n = batch.len();
    let spans = std::mem::replace(batch, Vec::with_capacity(MAX_BATCH));
    let error = match tokio::time::timeout(timeout, exporter.export(spans)).await {
        Ok(Ok(())) => {
            metrics.otel_spans_exported(n);
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {} ms", timeout.as_millis()),
    };
    metrics.otel_spans_dropped(SpanDrop::ExportFailed, n);
    if let Some(batches) = failures.due(Instant::now()) {
        tracing::warn!(
            error = %error,
            failed_batches = batches,
            "could not export spans to the OTLP collector; they are dropped (handoff_otel_spans_dropped_total)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Span as _, Tracer, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An exporter that never answers, as a collector that accepted the
    /// connection and hangs, or counts what it got.
    #[derive(Debug, Clone, Default)]
    struct Collector {
        hang: bool,
        got: Arc<AtomicUsize>,
    }

    impl SpanExporter for Collector {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            if self.hang {
                std::future::pending::<()>().await;
            }
            self.got.fetch_add(batch.len(), Ordering::Relaxed);
            Ok(())
        }
    }

    fn dropped(metrics: &Metrics, reason: &str) -> u64 {
        let line = format!("handoff_otel_spans_dropped_total{{reason=\"{reason}\"}} ");
        metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&line)?.parse().ok())
            .unwrap_or(0)
    }

    fn tracer_with(processor: QueueProcessor) -> SdkTracerProvider {
        SdkTracerProvider::builder()
            .with_span_processor(processor)
            .build()
    }

    #[tokio::test]
    async fn a_hung_collector_costs_the_queue_and_the_rest_is_counted() {
        let metrics = Metrics::new();
        let collector = Collector {
            hang: true,
            ..Collector::default()
        };
        let (processor, exporter) = start(collector, 8, Duration::from_secs(3600), metrics.clone());
        let provider = tracer_with(processor);
        let tracer = provider.tracer("t");
        // The first 5 are taken by the export, which hangs; then 8 wait in
        // the queue and every further span is dropped at once.
        for _ in 0..5 {
            tracer.start("s").end();
        }
        tokio::time::sleep(BATCH_DELAY * 2).await;
        for _ in 0..1000 {
            tracer.start("s").end();
        }
        assert_eq!(dropped(&metrics, "queue_full"), 1000 - 8);
        exporter.shutdown(Duration::from_millis(100)).await;
    }

    #[tokio::test]
    async fn a_failing_export_counts_its_spans_dropped() {
        let metrics = Metrics::new();
        let collector = Collector {
            hang: true,
            ..Collector::default()
        };
        // The export times out after 50 ms.
        let (processor, exporter) =
            start(collector, 64, Duration::from_millis(50), metrics.clone());
        let provider = tracer_with(processor);
        let tracer = provider.tracer("t");
        for _ in 0..5 {
            tracer.start("s").end();
        }
        tokio::time::sleep(BATCH_DELAY + Duration::from_millis(500)).await;
        assert_eq!(dropped(&metrics, "export_failed"), 5);
        assert_eq!(dropped(&metrics, "queue_full"), 0);
        exporter.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn shutdown_exports_what_is_queued() {
        let metrics = Metrics::new();
        let collector = Collector::default();
        let got = Arc::clone(&collector.got);
        let (processor, exporter) = start(collector, 4096, Duration::from_secs(5), metrics.clone());
        let provider = tracer_with(processor);
        let tracer = provider.tracer("t");
        for _ in 0..1500 {
            let mut span = tracer.start("s");
            span.set_attribute(opentelemetry::KeyValue::new("k", 1));
            span.end();
        }
        exporter.shutdown(Duration::from_secs(5)).await;
        assert_eq!(got.load(Ordering::Relaxed), 1500);
        assert!(
            metrics
                .encode()
                .contains("handoff_otel_spans_exported_total 1500")
        );
    }
}
