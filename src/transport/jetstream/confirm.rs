//! Confirming that core messages reached the server, one round trip for many.
//!
//! A probe is one round trip on the connection's own echo subject
//! ([`Echo`]): it confirms every publish enqueued before it, not only one.
//!
//! Probes are numbered in the order they are enqueued. A caller that has
//! enqueued its publish asks for the next probe number not started yet; the
//! first caller that finds no probe in flight sends the next one (no
//! background task), and every caller waiting for that number or a lower one
//! is answered by its outcome. While one probe is out, later callers gather
//! for the next: a burst of replies costs a few round trips, not one each.

use crate::transport::{Echo, RoundTripError};
use async_nats::Client;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;

/// Why a publish is not confirmed: it may be lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfirmError {
    /// The probe's request failed (timeout, disconnect): the server's
    /// answer, as the client reported it.
    #[error("the server did not confirm receipt: {0}")]
    Unanswered(String),
    /// The caller that sent the probe was cancelled before its answer.
    #[error("the confirmation was cancelled")]
    Cancelled,
    #[error("the confirmation channel closed")]
    Closed,
}

/// The last probe that finished, and whether the server answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Finished {
    number: u64,
    outcome: Result<(), ConfirmError>,
}

#[derive(Debug, Default)]
struct State {
    /// Probes started so far; the next one gets `started + 1`.
    started: u64,
    /// Whether a probe is out now.
    in_flight: bool,
}

/// Shared by every handler of one connection.
#[derive(Clone)]
pub struct Confirmer {
    client: Client,
    state: Arc<Mutex<State>>,
    finished: Arc<watch::Sender<Finished>>,
    /// The probes' subject, subscribed at the first probe; used by one
    /// probe at a time (the one in flight).
    echo: Arc<tokio::sync::Mutex<Option<Echo>>>,
}

impl Confirmer {
    pub fn new(client: Client) -> Confirmer {
        let (finished, _) = watch::channel(Finished {
            number: 0,
            outcome: Ok(()),
        });
        Confirmer {
            client,
            state: Arc::default(),
            finished: Arc::new(finished),
            echo: Arc::default(),
        }
    }

    /// One round trip on the probes' subject, subscribing it first if need
    /// be; a subscription that ended is made again at the next probe.
    async fn round_trip(&self) -> Result<(), RoundTripError> {
        let mut echo = self.echo.lock().await;
        let ready = match &mut *echo {
            Some(ready) => ready,
            None => echo.insert(Echo::new(&self.client).await?),
        };
        let outcome = ready.round_trip().await;
        if matches!(outcome, Err(RoundTripError::Closed)) {
            *echo = None;
        }
        outcome
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update is a plain assignment: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until the server has processed everything this connection
    /// enqueued before the call. Call it after the publish it confirms.
    /// An error names what failed; the publish may then be lost.
    pub async fn confirm(&self) -> Result<(), ConfirmError> {
        let mut finished = self.finished.subscribe();
        // A probe started after this line is enqueued after the caller's
        // publish, which is already in the connection's queue.
        let target = self.lock().started + 1;
        loop {
            {
                let last = finished.borrow_and_update();
                if last.number >= target {
                    return last.outcome.clone();
                }
            }
            if let Some(probe) = self.start_probe() {
                probe.run().await;
                continue;
            }
            if finished.changed().await.is_err() {
                return Err(ConfirmError::Closed);
            }
        }
    }

    /// Starts the next probe unless one is out.
    fn start_probe(&self) -> Option<Probe> {
        let mut state = self.lock();
        if state.in_flight {
            return None;
        }
        state.in_flight = true;
        state.started += 1;
        Some(Probe {
            confirmer: self.clone(),
            number: state.started,
            outcome: None,
        })
    }
}

/// One probe out. Dropped before it finished (its caller was cancelled), it
/// still reports an outcome, so the callers waiting for it never hang.
struct Probe {
    confirmer: Confirmer,
    number: u64,
    outcome: Option<Result<(), ConfirmError>>,
}

impl Probe {
    async fn run(mut self) {
        let outcome = self.confirmer.round_trip().await;
        self.outcome = Some(outcome.map_err(|e| ConfirmError::Unanswered(e.to_string())));
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let outcome = self.outcome.take().unwrap_or(Err(ConfirmError::Cancelled));
        self.confirmer.lock().in_flight = false;
        self.confirmer.finished.send_replace(Finished {
            number: self.number,
            outcome,
        });
    }
}
