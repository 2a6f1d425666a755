//! Events from outside the hot path: identity changes (fenced, machine ID,
//! lease recoveries) and NATS connection events (reconnects, readiness).

use super::{Metrics, Readiness};
use crate::identity::IdentityState;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Decides, from a stream of identity states, when a lease was recovered: a
/// slot installed after an earlier one, with a different lease or after being
/// fenced. Pure, so the rule is tested without etcd.
///
/// `watch` channels keep only the newest state, so a fence followed at once by
/// a new install may arrive as the install alone; the changed lease ID still
/// marks it as a recovery.
#[derive(Debug, Default, Clone)]
pub struct IdentityTracker {
    /// The lease of the last installed slot, if a slot was ever installed.
    last_installed: Option<i64>,
    fenced_since_install: bool,
}

impl IdentityTracker {
    /// Feeds one state; true when it is a recovery.
    pub fn observe(&mut self, state: &IdentityState) -> bool {
        if state.fenced || state.machine_id.is_none() {
            if self.last_installed.is_some() {
                self.fenced_since_install = true;
            }
            return false;
        }
        let lease = state.lease_id.unwrap_or(0);
        let recovered = match self.last_installed {
            None => false,
            Some(previous) => previous != lease || self.fenced_since_install,
        };
        self.last_installed = Some(lease);
        self.fenced_since_install = false;
        recovered
    }
}

impl Metrics {
    /// Spawns a task that keeps the `fenced` and `machine_id` gauges current
    /// and counts lease recoveries. It ends when the identity is dropped. Call
    /// from inside a tokio runtime.
    pub fn watch_identity(&self, mut states: watch::Receiver<IdentityState>) -> JoinHandle<()> {
        let metrics = self.clone();
        let mut tracker = IdentityTracker::default();
        tokio::spawn(async move {
            loop {
                let state = *states.borrow_and_update();
                metrics.set_identity(state.fenced, state.machine_id.map(|m| m.get()));
                if tracker.observe(&state) {
                    metrics.lease_recovered();
                    tracing::info!(
                        lease_id = state.lease_id,
                        machine_id = state.machine_id.map(|m| m.get()),
                        "lease recovered"
                    );
                }
                if states.changed().await.is_err() {
                    return;
                }
            }
        })
    }
}

type EventFuture = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// A callback for `async_nats::ConnectOptions::event_callback` that counts
/// reconnects and keeps [`Readiness::set_nats_connected`] current:
///
/// ```no_run
/// # async fn f(metrics: prefill_handoff::metrics::Metrics, readiness: prefill_handoff::metrics::Readiness) {
/// let options = async_nats::ConnectOptions::new()
///     .event_callback(prefill_handoff::metrics::on_nats_event(metrics, readiness));
/// # }
/// ```
///
/// async-nats reports the first connection as `Connected` too; only the ones
/// after it count as reconnects.
pub fn on_nats_event(
    metrics: Metrics,
    readiness: Readiness,
) -> impl Fn(async_nats::Event) -> EventFuture + Send + Sync + 'static {
    let connected_before = Arc::new(AtomicBool::new(false));
    let slow_log = Arc::new(RateLimitedLog::default());
    move |event| {
        match &event {
            async_nats::Event::Connected => {
                readiness.set_nats_connected(true);
                if connected_before.swap(true, Ordering::Relaxed) {
                    metrics.nats_reconnected();
                    tracing::info!("NATS connection re-established");
                }
            }
            async_nats::Event::Disconnected | async_nats::Event::Closed => {
                readiness.set_nats_connected(false);
                // The client sees only EOF when the server cuts it off as a
                // slow consumer (no `-ERR`): what was queued for it is gone
                // in core mode, and this line is the only trace the worker
                // can leave of it.
                tracing::warn!(
                    %event,
                    "NATS connection lost; in core mode, results the server had queued for this worker get no output (at most once; if the server logged \"Slow Consumer Detected\", the worker read slower than results came: add workers or use jetstream mode); in jetstream mode they are redelivered"
                );
            }
            async_nats::Event::SlowConsumer(_) => {
                metrics.slow_consumer_drop();
                if let Some(dropped) = slow_log.due(Instant::now()) {
                    tracing::error!(
                        dropped,
                        "the NATS client dropped incoming results: the subscription buffer (nats.subscription_capacity) is full, so they get no output; raise the capacity, add workers, or use jetstream mode"
                    );
                }
            }
            async_nats::Event::ServerError(async_nats::ServerError::Other(text))
                if is_permission_violation(text) =>
            {
                readiness.set_permission_violation(text.clone());
                tracing::warn!(%event, "the NATS server refused this worker a subject");
            }
            other => tracing::warn!(event = %other, "NATS event"),
        }
        Box::pin(async {})
    }
}

/// Whether a server's `-ERR` text is a permissions violation
/// (`Permissions Violation for Publish to "..."`, `... for Subscription to
/// "..."`).
fn is_permission_violation(text: &str) -> bool {
    text.get(..21)
        .is_some_and(|start| start.eq_ignore_ascii_case("permissions violation"))
}

/// How often a slow-consumer burst is logged: one line per interval, with
/// the count since the last line, instead of one line per dropped message.
const SLOW_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Counts events and says when a summary line is due. Also used for what
/// the byte budget refuses (`transport::core::intake`).
#[derive(Default)]
pub struct RateLimitedLog {
    /// (events not yet logged, when the last line was written)
    state: Mutex<(u64, Option<Instant>)>,
}

impl RateLimitedLog {
    /// Records one event; returns the count to log when a line is due (the
    /// first event, then at most once per [`SLOW_LOG_INTERVAL`]).
    pub fn due(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 += 1;
        if state
            .1
            .is_some_and(|last| now.duration_since(last) < SLOW_LOG_INTERVAL)
        {
            return None;
        }
        let count = state.0;
        *state = (0, Some(now));
        Some(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_consumer_lines_are_one_per_interval_with_the_count() {
        let log = RateLimitedLog::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // (time of the event, what `due` answers)
        let cases = [
            (0, Some(1)),
            (1, None),
            (5_000, None),
            (9_999, None),
            (10_000, Some(4)),
            (10_001, None),
            (25_000, Some(2)),
        ];
        for (ms, expected) in cases {
            assert_eq!(log.due(at(ms)), expected, "event at {ms} ms");
        }
    }
    use crate::ids::MachineId;

    fn installed(lease: i64, slot: i128) -> IdentityState {
        IdentityState {
            lease_id: Some(lease),
            machine_id: Some(MachineId::new(slot).unwrap()),
            fenced: false,
        }
    }

    fn fenced(lease: Option<i64>) -> IdentityState {
        IdentityState {
            lease_id: lease,
            machine_id: None,
            fenced: true,
        }
    }

    #[test]
    fn recoveries_are_new_installs_after_the_first() {
        // (name, states in order, recoveries expected after each)
        let cases: [(&str, Vec<IdentityState>, Vec<bool>); 6] = [
            (
                "first install",
                vec![fenced(None), installed(7, 7)],
                vec![false, false],
            ),
            (
                "same state repeated",
                vec![installed(7, 7), installed(7, 7)],
                vec![false, false],
            ),
            (
                "fence then new lease",
                vec![
                    installed(7, 7),
                    fenced(Some(7)),
                    fenced(Some(9)),
                    installed(9, 9),
                ],
                vec![false, false, false, true],
            ),
            (
                "fence coalesced away",
                vec![installed(7, 7), installed(9, 9)],
                vec![false, true],
            ),
            (
                "fenced and reinstalled on the same lease",
                vec![installed(7, 7), fenced(Some(7)), installed(7, 7)],
                vec![false, false, true],
            ),
            (
                "fenced before any install",
                vec![
                    fenced(None),
                    fenced(Some(3)),
                    installed(3, 3),
                    fenced(Some(3)),
                ],
                vec![false, false, false, false],
            ),
        ];
        for (name, states, want) in cases {
            let mut tracker = IdentityTracker::default();
            let got: Vec<bool> = states.iter().map(|s| tracker.observe(s)).collect();
            assert_eq!(got, want, "{name}");
        }
    }
}
