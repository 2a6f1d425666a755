//! Intake: takes every result off the transport as soon as it arrives and
//! holds its bytes in the worker's byte budget (`max_in_flight_bytes`), or
//! refuses it when the budget is spent.
//!
//! Reading is not gated on free in-flight slots: a result waiting for a slot
//! waits here, in bytes the budget counts, not in the NATS client's
//! subscription buffer, which is bounded only by a count of messages
//! (`nats.subscription_capacity`) of up to the server's max_payload each.
//! Measured before this: 2,000 results of 1 MiB at one worker grew it past
//! 1 GiB against nats-server 2.9.10.
//!
//! A refused result still gets its one output: a dead letter `over_budget`
//! without the input's bytes (which are what is over budget), saying how many
//! there were. It is counted in `handoff_dead_letters_total{code="over_budget"}`
//! and logged at most once per 10 s with the count.

use super::{Handled, Worker, handle::output_headers};
use crate::decision::{self, DeadLetterCode, Outcome};
use crate::metrics::RateLimitedLog;
use crate::transport::budget::Held;
use crate::transport::{Inbound, Incoming};
use bytes::Bytes;
use futures::future::OptionFuture;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// A result taken, with its bytes held until it is dropped.
pub(super) struct Admitted {
    pub incoming: Incoming,
    pub held: Held,
}

/// The worker loop's side of the intake task.
pub(super) struct Intake {
    admitted: mpsc::UnboundedReceiver<Admitted>,
    drain: Option<oneshot::Sender<oneshot::Sender<()>>>,
}

impl Intake {
    /// Starts taking results from `inbound`.
    pub fn start(inbound: Inbound, worker: Arc<Worker>) -> Intake {
        // Unbounded in count; bounded in bytes by the budget each result holds.
        let (tx, admitted) = mpsc::unbounded_channel();
        let (drain, drain_rx) = oneshot::channel();
        tokio::spawn(run(inbound, worker, tx, drain_rx));
        Intake {
            admitted,
            drain: Some(drain),
        }
    }

    /// The next result taken; `None` once the transport is drained or closed
    /// and every result taken is out. Cancel-safe.
    pub async fn next(&mut self) -> Option<Admitted> {
        self.admitted.recv().await
    }

    /// A result already taken, if any; never waits.
    pub fn ready(&mut self) -> Option<Admitted> {
        self.admitted.try_recv().ok()
    }

    /// Stops taking new input (see [`Inbound::drain`]); returns once the
    /// transport accepted the drain.
    pub async fn drain(&mut self) {
        let Some(drain) = self.drain.take() else {
            return;
        };
        let (done, accepted) = oneshot::channel();
        if drain.send(done).is_ok() {
            let _ = accepted.await;
        }
    }
}

async fn run(
    mut inbound: Inbound,
    worker: Arc<Worker>,
    admitted: mpsc::UnboundedSender<Admitted>,
    drain: oneshot::Receiver<oneshot::Sender<()>>,
) {
    let mut drain = Some(drain);
    let refusals = RateLimitedLog::default();
    loop {
        let next = tokio::select! {
            biased;
            request = OptionFuture::from(drain.as_mut()), if drain.is_some() => {
                drain = None;
                if let Some(Ok(done)) = request {
                    inbound.drain().await;
                    let _ = done.send(());
                }
                continue;
            }
            next = inbound.next() => next,
        };
        let Some(incoming) = next else { break };
        match worker.budget.try_hold(incoming.payload.len()) {
            Some(held) => {
                let mut incoming = incoming;
                incoming.payload = own_allocation(incoming.payload);
                if admitted.send(Admitted { incoming, held }).is_err() {
                    break;
                }
            }
            None => worker.refuse_over_budget(incoming, &refusals).await,
        }
    }
}

/// The payload in an allocation of its own size. The NATS client slices
/// each payload out of its read buffer, whose allocation (grown to hold a
/// 1 MiB message, often with part of the next) stays alive while any slice
/// of it does: held results pinned several times their own bytes. A large
/// payload is copied out (~0.1 ms per MiB) so that what the budget counts is
/// what is held.
pub(crate) fn own_allocation(payload: Bytes) -> Bytes {
    if payload.len() < crate::transport::offload::LARGE {
        return payload;
    }
    Bytes::copy_from_slice(&payload)
}

impl Worker {
    /// Answers a result the byte budget has no room for (see the module doc).
    async fn refuse_over_budget(&self, mut incoming: Incoming, log: &RateLimitedLog) {
        // The bytes go first: a flood of refusals must not hold them.
        let bytes = std::mem::take(&mut incoming.payload).len();
        self.stats.received(1);
        let held = self.options.max_in_flight_bytes - self.budget.available();
        let why = format!(
            "the worker held {held} bytes of results (max_in_flight_bytes {}) and had no room for this one's {bytes} bytes; it was not decided",
            self.options.max_in_flight_bytes
        );
        let code = DeadLetterCode::OverBudget;
        let set = decision::dead_letter_headers(code, &why, &incoming.subject);
        let set = decision::without_payload(&set, bytes);
        let trace = crate::transport::trace_headers(incoming.headers.as_ref());
        self.metrics.trace_headers_dropped(&trace.dropped);
        let headers = output_headers(&set, &trace);
        let outcome = Outcome::DeadLetter { code };
        let result = self
            .outbound
            .publish(&self.rules.dead_letter_subject, headers, Bytes::new())
            .await;
        let handled = match result {
            Ok(()) => {
                self.metrics
                    .record(&outcome, 0, incoming.received_at.elapsed());
                Handled::Published(outcome)
            }
            Err(e) => {
                self.metrics.publish_failed();
                tracing::error!(source = %incoming.subject, error = %e, "could not publish an over_budget dead letter; this result has no output");
                Handled::Failed(outcome)
            }
        };
        self.stats.handled(&handled);
        if let Some(refused) = log.due(Instant::now()) {
            tracing::warn!(
                refused,
                held,
                max_in_flight_bytes = self.options.max_in_flight_bytes,
                "results refused: the worker's byte budget is spent; each got an over_budget dead letter without its bytes. Add workers, raise max_in_flight_bytes (and the memory limit), or use jetstream mode"
            );
        }
    }
}
