//! Prometheus metrics and the `/healthz` and `/readyz` endpoints.
//!
//! (Skeleton: the recording API the worker calls. The Prometheus registry and
//! the HTTP server arrive with the metrics issue.)

use crate::decision::Outcome;
use std::time::Duration;

/// The worker's metrics. Cheap to clone; every method is thread-safe.
#[derive(Clone, Default)]
pub struct Metrics {}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {}
    }

    /// One input handled: its outcome, how many trailing frames were ignored,
    /// and the time from receipt to publish.
    pub fn record(&self, outcome: &Outcome, trailing_frames: usize, latency: Duration) {
        let _ = (outcome, trailing_frames, latency);
    }

    /// The NATS connection came back after a disconnect.
    pub fn nats_reconnected(&self) {}
}
