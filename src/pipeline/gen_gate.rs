//! A GEN stream that refuses decode jobs: at its `max_msgs` or `max_bytes`
//! with discard policy `new` (or its store failing), it answers every
//! publish with an error until it has room again.
//!
//! A refused decode job is neither acked (its result would have no output)
//! nor nak'd: each nak uses up a delivery, and after `max_deliver` of them
//! the result would stay in the work queue with no output, for good. Its
//! delivery is held instead (in-progress acks keep its ack wait from
//! running out; they do not count as deliveries) and the publish is tried
//! again once GEN has room.
//!
//! Every decode job would be refused alike, so one held job at a time
//! probes GEN, after a backoff that doubles from [`FIRST_PROBE`] up to
//! [`LAST_PROBE`]; the others wait for its answer. A full GEN costs one
//! publish per backoff, not one per held result, and nothing spins. Held
//! results keep their processing slots: once every slot is held no new
//! pull is sent, and the backlog waits in the prefill stream, stored.
//! Results that need no GEN (replies, dead letters) go on while slots are
//! free.
//!
//! While GEN refuses, `handoff_gen_refusing` is 1, `/readyz` names
//! `gen_accepting`, and a log line says so once (and once more when GEN
//! accepts again).

use crate::metrics::{Metrics, Readiness};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The first wait before GEN is tried again.
pub const FIRST_PROBE: Duration = Duration::from_millis(250);
/// The longest wait between two tries: how long a held result may wait
/// after GEN has room again.
pub const LAST_PROBE: Duration = Duration::from_secs(5);

/// Shared by every delivery of one worker.
pub struct GenGate {
    /// Mirrors `State::refusing_since.is_some()`: the path of a decode job
    /// while GEN accepts reads this and nothing else.
    refusing: AtomicBool,
    state: Mutex<State>,
    /// Bumped when GEN accepts again or a probe ends without an answer:
    /// the waiting deliveries look again.
    changed: watch::Sender<u64>,
    metrics: Metrics,
    readiness: Option<Readiness>,
}

#[derive(Debug, Default)]
struct State {
    /// Since when GEN refuses; `None` while it accepts.
    refusing_since: Option<Instant>,
    /// Whether a held delivery is the probe now.
    probing: bool,
    /// The probe's wait before its next try.
    backoff: Duration,
}

/// Leave to publish a decode job. The probe's, dropped without an answer
/// (its publish failed otherwise, or its task was cancelled), hands the
/// probe on to a waiting delivery.
#[must_use = "report the publish with stored() or refused()"]
pub struct Pass<'a> {
    gate: &'a GenGate,
    probe: bool,
}

impl GenGate {
    pub fn new(metrics: Metrics, readiness: Option<Readiness>) -> GenGate {
        GenGate {
            refusing: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
            metrics,
            readiness,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a few plain assignments: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether GEN accepted the last decode job.
    pub fn accepting(&self) -> bool {
        !self.refusing.load(Ordering::Acquire)
    }

    /// Leave to publish: at once while GEN accepts; while it refuses, when
    /// this delivery's turn to probe has come (after the backoff) or GEN
    /// accepts again.
    pub async fn pass(&self) -> Pass<'_> {
        if self.accepting() {
            return Pass {
                gate: self,
                probe: false,
            };
        }
        // Boxed: rare, and inline its sleep would grow every result's future.
        Box::pin(self.wait()).await
    }

    async fn wait(&self) -> Pass<'_> {
        let mut changed = self.changed.subscribe();
        loop {
            let probe_after = {
                let mut state = self.lock();
                if state.refusing_since.is_none() {
                    return Pass {
                        gate: self,
                        probe: false,
                    };
                }
                if state.probing {
                    None
                } else {
                    state.probing = true;
                    Some(state.backoff)
                }
            };
            if let Some(backoff) = probe_after {
                let pass = Pass {
                    gate: self,
                    probe: true,
                };
                tokio::time::sleep(backoff).await;
                return pass;
            }
            // The sender lives as long as `self`: never closed here.
            let _ = changed.changed().await;
        }
    }

    /// GEN stored the decode job: if it was refusing, it accepts again and
    /// every waiting delivery goes.
    pub fn stored(&self, mut pass: Pass<'_>) {
        let probe = std::mem::take(&mut pass.probe);
        let mut state = self.lock();
        if probe {
            state.probing = false;
        }
        let Some(since) = state.refusing_since.take() else {
            return;
        };
        self.refusing.store(false, Ordering::Release);
        drop(state);
        self.metrics.gen_refusing(false);
        if let Some(readiness) = &self.readiness {
            readiness.set_gen_accepting(true);
        }
        tracing::info!(
            refused_for_ms = since.elapsed().as_millis() as u64,
            "the GEN stream accepts decode jobs again; the held results go on"
        );
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// GEN refused the decode job (`reason`, as the server said it): the
    /// caller asks for a [`GenGate::pass`] again and tries once more.
    pub fn refused(&self, mut pass: Pass<'_>, reason: &str) {
        let probe = std::mem::take(&mut pass.probe);
        self.metrics.gen_refused();
        let mut state = self.lock();
        if probe {
            state.probing = false;
            state.backoff = state.backoff.saturating_mul(2).min(LAST_PROBE);
        }
        if state.refusing_since.is_some() {
            return;
        }
        state.refusing_since = Some(Instant::now());
        state.backoff = FIRST_PROBE;
        self.refusing.store(true, Ordering::Release);
        drop(state);
        self.metrics.gen_refusing(true);
        if let Some(readiness) = &self.readiness {
            readiness.set_gen_accepting(false);
        }
        tracing::warn!(
            reason,
            "the GEN stream refuses decode jobs (at its limits with discard policy new?); their results are held, not acked, and GEN is tried again every {} s at most",
            LAST_PROBE.as_secs()
        );
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.gate.lock().probing = false;
            self.gate.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> GenGate {
        GenGate::new(Metrics::new(), None)
    }

    #[tokio::test(start_paused = true)]
    async fn accepting_gives_leave_at_once() {
        let gate = gate();
        let pass = gate.pass().await;
        assert!(!pass.probe);
        gate.stored(pass);
        assert!(gate.accepting());
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_at_a_time_with_a_doubling_backoff() {
        let gate = gate();
        gate.refused(gate.pass().await, "maximum messages exceeded");
        assert!(!gate.accepting());
        let start = tokio::time::Instant::now();
        let probe = gate.pass().await;
        assert!(probe.probe);
        assert_eq!(start.elapsed(), FIRST_PROBE);
        // A second delivery waits while the probe is out.
        let waiting = gate.pass();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        gate.refused(probe, "maximum messages exceeded");
        // The next probe waits twice as long.
        let again = tokio::time::Instant::now();
        let probe = gate.pass().await;
        assert_eq!(again.elapsed(), FIRST_PROBE * 2);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        gate.stored(probe);
        let released = waiting.await;
        assert!(!released.probe, "GEN accepts: the waiting delivery goes");
        assert!(gate.accepting());
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_dropped_without_an_answer_hands_the_probe_on() {
        let gate = gate();
        gate.refused(gate.pass().await, "maximum bytes exceeded");
        let probe = gate.pass().await;
        let waiting = gate.pass();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(probe);
        let next = waiting.await;
        assert!(next.probe, "the waiting delivery probes next");
    }

    #[tokio::test(start_paused = true)]
    async fn the_backoff_is_capped() {
        let gate = gate();
        gate.refused(gate.pass().await, "full");
        for _ in 0..10 {
            let probe = gate.pass().await;
            gate.refused(probe, "full");
        }
        assert_eq!(gate.lock().backoff, LAST_PROBE);
    }
}
