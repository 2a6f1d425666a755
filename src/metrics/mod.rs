//! Prometheus metrics and the `/metrics`, `/healthz` and `/readyz` endpoints.
//!
//! [`Metrics`] is a cheap, clonable handle the worker records into on its hot
//! path. Every label value is a bounded enum, and every series is created at
//! start (so all of them exist at 0 before the first event) and cached: a
//! record is a few relaxed atomic adds, with no allocation and no lock.
//!
//! - `labels.rs`: the label values, one bounded enum per label.
//! - `latency.rs`: the lock-free receipt → publish histogram.
//! - `watch.rs`: identity and NATS connection events → gauges, counters, readiness.
//! - `readiness.rs`: what `/readyz` checks.
//! - `http.rs`: the pure HTTP/1.1 request parser and router; `server.rs`: the
//!   TCP shell around it ([`serve`]).

mod http;
mod labels;
mod latency;
mod readiness;
mod server;
mod watch;

pub use labels::{CancelEvent, IdRequestResult, MintSource, NakReason, SpanDrop};
use labels::{OUTCOME_KINDS, outcome_index};
pub use latency::LatencyHistogram;
pub use readiness::{Readiness, ReadinessReport};
pub use server::{ServeError, Server, serve};
pub use watch::{IdentityTracker, RateLimitedLog, on_nats_event};

use crate::decision::{Backend, DeadLetterCode, ErrorCode, FinishReason, Outcome};
use crate::headers::TraceHeader;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

type Labels = [(&'static str, &'static str); 1];

/// The worker's metrics. Cheap to clone; every method is thread-safe.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

/// Every label handle below is indexed by its enum's discriminant, which is
/// its position in the enum's `ALL` (checked by a test).
struct Inner {
    registry: Registry,
    outputs: [Counter; 4],
    terminal: [Counter; FinishReason::ALL.len()],
    errors: [Counter; ErrorCode::ALL.len()],
    dead_letters: [Counter; DeadLetterCode::ALL.len()],
    decode_jobs: [Counter; Backend::ALL.len()],
    trailing_frames: Counter,
    ids_minted: [Counter; MintSource::ALL.len()],
    id_requests: [Counter; IdRequestResult::ALL.len()],
    lease_recoveries: Counter,
    nats_reconnects: Counter,
    slow_consumer_drops: Counter,
    publish_failures: Counter,
    naks: [Counter; NakReason::ALL.len()],
    redeliveries: Counter,
    gen_window_lookup_failures: Counter,
    trace_headers_dropped: [Counter; TraceHeader::ALL.len()],
    otel_spans_exported: Counter,
    otel_spans_dropped: [Counter; SpanDrop::ALL.len()],
    fenced: Gauge,
    machine_id: Gauge,
    in_flight: Gauge,
    tasks: Gauge,
    latency: LatencyHistogram,
    cancels: [Counter; CancelEvent::ALL.len()],
    cancels_held: Gauge,
    /// Published, then failed.
    release_notices: [Counter; 2],
    deadline_remaining: LatencyHistogram,
    gen_refusing: Gauge,
    gen_refusals: Counter,
}

/// Registers a counter family with one label and creates every series of it.
fn counter_family<const N: usize>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    label: &'static str,
    values: [&'static str; N],
) -> [Counter; N] {
    let family = Family::<Labels, Counter>::default();
    registry.register(name, help, family.clone());
    values.map(|value| family.get_or_create(&[(label, value)]).clone())
}

fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let counter = Counter::default();
    registry.register(name, help, counter.clone());
    counter
}

fn gauge(registry: &mut Registry, name: &str, help: &str, initial: i64) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(initial);
    registry.register(name, help, gauge.clone());
    gauge
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every series, each at its starting value.
    #[expect(
        clippy::too_many_lines,
        reason = "a table, one entry per series with its name, help and labels: \
                  one list is what a reader checks against /metrics"
    )]
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("handoff");
        let info = Family::<[(&'static str, &'static str); 1], Gauge>::default();
        r.register(
            "build_info",
            "Always 1; the version label names the running prefill-handoff",
            info.clone(),
        );
        info.get_or_create(&[("version", env!("CARGO_PKG_VERSION"))])
            .set(1);
        let inner = Inner {
            outputs: counter_family(
                &mut r,
                "outputs",
                "Inputs handled, by the one output published for each",
                "outcome",
                OUTCOME_KINDS,
            ),
            terminal: counter_family(
                &mut r,
                "terminal",
                "Terminal responses, by the first frame's finish reason (unknown reasons are 'other')",
                "finish_reason",
                FinishReason::ALL.map(FinishReason::as_str),
            ),
            errors: counter_family(
                &mut r,
                "error_responses",
                "Error responses sent to reply subjects, by error code",
                "code",
                ErrorCode::ALL.map(ErrorCode::as_str),
            ),
            dead_letters: counter_family(
                &mut r,
                "dead_letters",
                "Inputs sent to the dead-letter subject, by dead-letter code",
                "code",
                DeadLetterCode::ALL.map(DeadLetterCode::as_str),
            ),
            decode_jobs: counter_family(
                &mut r,
                "decode_jobs",
                "Decode jobs published to the GEN subject, by handoff backend",
                "backend",
                Backend::ALL.map(Backend::as_str),
            ),
            trailing_frames: counter(
                &mut r,
                "trailing_frames_ignored",
                "Frames after the first of a prefill result; they never change the outcome",
            ),
            ids_minted: counter_family(
                &mut r,
                "ids_minted",
                "Request IDs minted from this worker's machine-ID slot, by where they went",
                "source",
                MintSource::ALL.map(MintSource::as_str),
            ),
            id_requests: counter_family(
                &mut r,
                "id_requests",
                "Requests to the ID mint service, by result",
                "result",
                IdRequestResult::ALL.map(IdRequestResult::as_str),
            ),
            lease_recoveries: counter(
                &mut r,
                "lease_recoveries",
                "Times a new etcd lease and slot were installed after the first one (the old lease was lost)",
            ),
            nats_reconnects: counter(
                &mut r,
                "nats_reconnects",
                "Times the NATS connection came back after a disconnect",
            ),
            slow_consumer_drops: counter(
                &mut r,
                "nats_slow_consumer_drops",
                "Incoming messages the NATS client dropped because the worker's subscription buffer was full (nats.subscription_capacity); each is a result that gets no output. A lower bound: the client may drop more than it reports",
            ),
            publish_failures: counter(
                &mut r,
                "publish_failures",
                "Outputs that could not be published to NATS",
            ),
            naks: counter_family(
                &mut r,
                "jetstream_naks",
                "JetStream messages negatively acknowledged for redelivery, by reason",
                "reason",
                NakReason::ALL.map(NakReason::as_str),
            ),
            redeliveries: counter(
                &mut r,
                "jetstream_redeliveries",
                "JetStream messages received that had been delivered before",
            ),
            gen_window_lookup_failures: counter(
                &mut r,
                "gen_window_lookup_failures",
                "Times the GEN stream's duplicate window could not be read at start; the configured one (jetstream.duplicate_window_secs) is used instead",
            ),
            trace_headers_dropped: counter_family(
                &mut r,
                "trace_headers_dropped",
                "Input trace headers not copied to the output because they are not well-formed W3C Trace Context or exceed its sizes (traceparent 55 characters, tracestate 512 bytes / 32 members), by header",
                "header",
                TraceHeader::ALL.map(TraceHeader::as_str),
            ),
            otel_spans_exported: counter(
                &mut r,
                "otel_spans_exported",
                "Spans the OTLP collector accepted (otel.endpoint)",
            ),
            otel_spans_dropped: counter_family(
                &mut r,
                "otel_spans_dropped",
                "Finished spans never exported, by reason: queue_full (otel.queue_spans waiting already), export_failed (collector unreachable, refusing, or slower than otel.export_timeout_ms)",
                "reason",
                SpanDrop::ALL.map(SpanDrop::as_str),
            ),
            fenced: gauge(
                &mut r,
                "fenced",
                "1 while the worker holds no valid machine-ID slot and refuses to mint, else 0",
                1,
            ),
            machine_id: gauge(
                &mut r,
                "machine_id",
                "The machine-ID slot held now, -1 when none",
                -1,
            ),
            in_flight: gauge(
                &mut r,
                "in_flight",
                "Inputs received whose output is not yet published",
                0,
            ),
            tasks: gauge(
                &mut r,
                "tasks",
                "Tasks alive in the worker's tokio runtime, read at each scrape (a slow leak shows here first)",
                0,
            ),
            latency: {
                let h = LatencyHistogram::default();
                r.register(
                    "latency_seconds",
                    "Time from receiving a prefill result to publishing its output",
                    h.clone(),
                );
                h
            },
            cancels: counter_family(
                &mut r,
                "cancels",
                "Cancel messages and held cancels, by event: recorded, again (held already), late (its decode job had left), evicted (cancel.max_entries or cancel.max_bytes), expired (cancel.retention_secs), malformed",
                "event",
                CancelEvent::ALL.map(CancelEvent::as_str),
            ),
            cancels_held: gauge(
                &mut r,
                "cancels_held",
                "Cancelled request IDs this worker holds",
                0,
            ),
            release_notices: counter_family(
                &mut r,
                "release_notices",
                "KV release notices for handoffs refused as cancelled or deadline_exceeded, by whether they were published",
                "result",
                ["published", "failed"],
            ),
            deadline_remaining: {
                let h = LatencyHistogram::with_bounds(&latency::DEADLINE_BOUNDS_US);
                r.register(
                    "deadline_remaining_seconds",
                    "Time left to a result's deadline when it was decided (0 when already past), for results with a deadline",
                    h.clone(),
                );
                h
            },
            gen_refusing: gauge(
                &mut r,
                "gen_refusing",
                "1 while the GEN stream refuses decode jobs (at its max_msgs or max_bytes with discard policy new, or its store failing) and their results are held, else 0",
                0,
            ),
            gen_refusals: counter(
                &mut r,
                "gen_refusals",
                "Decode jobs the GEN stream refused to store; each is tried again, its result held meanwhile",
            ),
            registry: r,
        };
        Metrics {
            inner: Arc::new(inner),
        }
    }

    /// One input handled: its outcome, how many trailing frames were ignored,
    /// and the time from receipt to publish.
    pub fn record(&self, outcome: &Outcome, trailing_frames: usize, latency: Duration) {
        let m = &*self.inner;
        m.outputs[outcome_index(outcome)].inc();
        match outcome {
            Outcome::Decode { backend, minted } => {
                m.decode_jobs[*backend as usize].inc();
                if *minted {
                    m.ids_minted[MintSource::DecodeJob as usize].inc();
                }
            }
            Outcome::Terminal { finish_reason } => {
                m.terminal[*finish_reason as usize].inc();
            }
            Outcome::Error { code } => {
                m.errors[*code as usize].inc();
            }
            Outcome::DeadLetter { code } => {
                m.dead_letters[*code as usize].inc();
            }
        }
        if trailing_frames > 0 {
            m.trailing_frames.inc_by(trailing_frames as u64);
        }
        m.latency.observe(latency);
    }

    /// The NATS connection came back after a disconnect.
    pub fn nats_reconnected(&self) {
        self.inner.nats_reconnects.inc();
    }

    /// The NATS client dropped an incoming message: the subscription's
    /// buffer was full.
    pub fn slow_consumer_drop(&self) {
        self.inner.slow_consumer_drops.inc();
    }

    /// An error response sent beside a result's one output (the
    /// `over_budget` notice beside its dead letter): counted under its code,
    /// not as an output.
    pub fn side_error(&self, code: ErrorCode) {
        self.inner.errors[code as usize].inc();
    }

    /// An output could not be published.
    pub fn publish_failed(&self) {
        self.inner.publish_failures.inc();
    }

    /// A JetStream message was negatively acknowledged for redelivery.
    pub fn nacked(&self, reason: NakReason) {
        self.inner.naks[reason as usize].inc();
    }

    /// A JetStream message arrived that had been delivered before.
    pub fn redelivered(&self) {
        self.inner.redeliveries.inc();
    }

    /// One request to the ID mint service was handled; `minted` IDs were sent.
    pub fn id_request(&self, result: IdRequestResult, minted: usize) {
        self.inner.id_requests[result as usize].inc();
        if minted > 0 {
            self.inner.ids_minted[MintSource::IdService as usize].inc_by(minted as u64);
        }
    }

    /// The GEN stream's duplicate window could not be read at start.
    pub fn gen_window_lookup_failed(&self) {
        self.inner.gen_window_lookup_failures.inc();
    }

    /// Trace headers of one input were dropped instead of copied.
    pub fn trace_headers_dropped(&self, dropped: &[TraceHeader]) {
        for header in dropped {
            self.inner.trace_headers_dropped[*header as usize].inc();
        }
    }

    /// `n` spans were accepted by the OTLP collector.
    pub fn otel_spans_exported(&self, n: usize) {
        self.inner.otel_spans_exported.inc_by(n as u64);
    }

    /// `n` finished spans were dropped instead of exported.
    pub fn otel_spans_dropped(&self, reason: SpanDrop, n: usize) {
        self.inner.otel_spans_dropped[reason as usize].inc_by(n as u64);
    }

    /// `n` cancels had `event`.
    pub fn cancels(&self, event: CancelEvent, n: usize) {
        if n > 0 {
            self.inner.cancels[event as usize].inc_by(n as u64);
        }
    }

    /// The cancels held now.
    pub fn cancels_held(&self, n: usize) {
        self.inner
            .cancels_held
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A KV release notice was published, or could not be.
    pub fn release_notice(&self, published: bool) {
        self.inner.release_notices[usize::from(!published)].inc();
    }

    /// A result with a deadline was decided with this much time left.
    pub fn deadline_remaining(&self, left: Duration) {
        self.inner.deadline_remaining.observe(left);
    }

    /// Whether the GEN stream refuses decode jobs now.
    pub fn gen_refusing(&self, refusing: bool) {
        self.inner.gen_refusing.set(i64::from(refusing));
    }

    /// The GEN stream refused one decode job.
    pub fn gen_refused(&self) {
        self.inner.gen_refusals.inc();
    }

    /// Counts an input as in flight until the returned guard drops.
    pub fn in_flight(&self) -> InFlight<'_> {
        self.inner.in_flight.inc();
        InFlight {
            gauge: &self.inner.in_flight,
        }
    }

    pub(crate) fn lease_recovered(&self) {
        self.inner.lease_recoveries.inc();
    }

    pub(crate) fn set_identity(&self, fenced: bool, machine_id: Option<u16>) {
        self.inner.fenced.set(i64::from(fenced));
        self.inner.machine_id.set(machine_id.map_or(-1, i64::from));
    }

    /// Every metric in the Prometheus text format (version 0.0.4, see
    /// [`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        // Read here rather than kept current: the runtime counts its own
        // tasks, and a scrape is the only reader.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let alive = runtime.metrics().num_alive_tasks();
            self.inner
                .tasks
                .set(i64::try_from(alive).unwrap_or(i64::MAX));
        }
        let mut out = String::with_capacity(8 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.inner.registry);
        out
    }
}

/// An input in flight; dropping it (on any path) takes it off the gauge.
#[must_use = "the input counts as in flight only while the guard lives"]
pub struct InFlight<'a> {
    /// Borrowed, not cloned: a clone per message is one more atomic count
    /// shared by every worker thread.
    gauge: &'a Gauge,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests;
