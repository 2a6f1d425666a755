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
//!
//! A worker that stops closes the gate: the held results are handed back
//! to the work queue at once (nak'd), so that another worker takes them
//! without waiting out the ack wait and the drain does not wait out its
//! timeout for a GEN that may stay full. The nak uses the delivery that a
//! redelivery after the ack wait would use.

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
    /// The worker is stopping: no delivery is held any longer.
    closed: bool,
}

/// The worker is stopping and GEN refuses: the decode job is not tried
/// again here.
#[derive(Debug)]
pub struct Closed;

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
    /// accepts again; [`Closed`] while it refuses once the worker stops.
    pub async fn pass(&self) -> Result<Pass<'_>, Closed> {
        if self.accepting() {
            return Ok(Pass {
                gate: self,
                probe: false,
            });
        }
        // Boxed: rare, and inline its sleep would grow every result's future.
        Box::pin(self.wait()).await
    }

    /// The worker stops: every delivery waiting for GEN, and every later
    /// one while GEN refuses, gets [`Closed`].
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    async fn wait(&self) -> Result<Pass<'_>, Closed> {
        let mut changed = self.changed.subscribe();
        loop {
            let probe_after = {
                let mut state = self.lock();
                if state.refusing_since.is_none() {
                    return Ok(Pass {
                        gate: self,
                        probe: false,
                    });
                }
                if state.closed {
                    return Err(Closed);
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
                let sleep = tokio::time::sleep(backoff);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        () = &mut sleep => return Ok(pass),
                        // Only a close ends the backoff early (dropping the
                        // pass hands the probe on). Any other change (GEN
                        // accepting meanwhile) leaves the probe to its try:
                        // one that gave up its pass here would be woken
                        // again by its own hand-on, and never try.
                        _ = changed.changed() => {
                            let closed = self.lock().closed;
                            if closed {
                                return Err(Closed);
                            }
                        }
                    }
                }
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

    async fn open(gate: &GenGate) -> Pass<'_> {
        gate.pass().await.expect("the gate is open")
    }

    #[tokio::test(start_paused = true)]
    async fn accepting_gives_leave_at_once() {
        let gate = gate();
        let pass = open(&gate).await;
        assert!(!pass.probe);
        gate.stored(pass);
        assert!(gate.accepting());
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_at_a_time_with_a_doubling_backoff() {
        let gate = gate();
        gate.refused(open(&gate).await, "maximum messages exceeded");
        assert!(!gate.accepting());
        let start = tokio::time::Instant::now();
        let probe = open(&gate).await;
        assert!(probe.probe);
        assert_eq!(start.elapsed(), FIRST_PROBE);
        // A second delivery waits while the probe is out.
        let waiting = gate.pass();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        gate.refused(probe, "maximum messages exceeded");
        // The next probe waits twice as long.
        let again = tokio::time::Instant::now();
        let probe = open(&gate).await;
        assert_eq!(again.elapsed(), FIRST_PROBE * 2);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        gate.stored(probe);
        let released = waiting.await.expect("open");
        assert!(!released.probe, "GEN accepts: the waiting delivery goes");
        assert!(gate.accepting());
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_dropped_without_an_answer_hands_the_probe_on() {
        let gate = gate();
        gate.refused(open(&gate).await, "maximum bytes exceeded");
        let probe = open(&gate).await;
        let waiting = gate.pass();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(probe);
        let next = waiting.await.expect("open");
        assert!(next.probe, "the waiting delivery probes next");
    }

    #[tokio::test(start_paused = true)]
    async fn the_backoff_is_capped() {
        let gate = gate();
        gate.refused(open(&gate).await, "full");
        for _ in 0..10 {
            let probe = open(&gate).await;
            gate.refused(probe, "full");
        }
        assert_eq!(gate.lock().backoff, LAST_PROBE);
    }

    #[tokio::test(start_paused = true)]
    async fn closing_turns_away_the_held_deliveries_not_the_others() {
        let gate = gate();
        // While GEN accepts, a closed gate gives leave as before: results
        // in flight at a shutdown still finish.
        gate.close();
        let pass = open(&gate).await;
        gate.refused(pass, "full");
        assert!(gate.pass().await.is_err(), "a new delivery is not held");

        let gate = self::gate();
        gate.refused(open(&gate).await, "full");
        let probe = gate.pass();
        tokio::pin!(probe);
        assert!(
            futures::poll!(probe.as_mut()).is_pending(),
            "in its backoff"
        );
        let waiting = gate.pass();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        gate.close();
        assert!(
            probe.await.is_err(),
            "the probe's backoff ends at the close"
        );
        assert!(
            waiting.await.is_err(),
            "the waiting delivery is turned away"
        );
        assert!(!gate.lock().probing);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_during_the_backoff_does_not_cut_it_short() {
        let gate = gate();
        gate.refused(open(&gate).await, "full");
        let start = tokio::time::Instant::now();
        let probe = gate.pass();
        tokio::pin!(probe);
        assert!(futures::poll!(probe.as_mut()).is_pending());
        // As a publish stored out of order, or a probe handed on, would.
        gate.changed.send_modify(|n| *n = n.wrapping_add(1));
        let probe = probe.await.expect("open");
        assert!(probe.probe, "still the probe");
        assert_eq!(start.elapsed(), FIRST_PROBE, "after its whole backoff");
    }
}
