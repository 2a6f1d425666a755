//! The runner's input side: the batch's first delivery, the slots for its
//! batch, and the batch filled from what waits and what the source already
//! holds. Every wait on the input is one [`Runner::turn`]: the shutdown
//! starts the drain there, and the drain's deadline ends the taking.

use super::{BATCH, Runner};
use crate::transport::{Admission, Admitted, Delivery, Source};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

/// The runner's input while it runs: the source, what was taken from it
/// while no slot was free, and the shutdown that ends the taking.
pub(super) struct Inbound<'s, S> {
    pub(super) source: Source,
    /// Taken from the source while no slot was free, in arrival order:
    /// first in the next batches. Bounded by the byte budget each holds.
    pub(super) waiting: VecDeque<Admitted>,
    /// The source has ended: nothing more comes out of it.
    pub(super) closed: bool,
    pub(super) shutdown: Pin<&'s mut S>,
    /// Fires at `deadline` once draining started.
    pub(super) drain_timer: Pin<&'s mut Sleep>,
    /// Set when draining starts: the instant by which in-flight work must end.
    pub(super) deadline: Option<Instant>,
}

/// How one turn of waiting on the input ended ([`Runner::turn`]).
enum Turn<T> {
    /// What was waited for is there.
    Done(T),
    /// Something else happened (a delivery arrived or was refused, the
    /// source ended, the drain started): look again.
    Again,
    /// The drain's deadline passed: take nothing more.
    PastDeadline,
}

/// The drain's deadline passed before the batch had its slots.
pub(super) struct PastDeadline;

impl Runner {
    /// One turn of waiting for `until`, the one place the runner waits on
    /// its input. Meanwhile a shutdown starts the drain, and what the source
    /// delivers joins `waiting` (or is refused by the byte budget): reading
    /// goes on while every slot is taken, so what arrives waits here,
    /// counted in the byte budget, not in the NATS client's buffer, which
    /// only a count of messages bounds.
    async fn turn<S: Future<Output = ()>, T>(
        &self,
        inbound: &mut Inbound<'_, S>,
        until: Pin<&mut impl Future<Output = T>>,
    ) -> Turn<T> {
        let draining = inbound.deadline.is_some();
        tokio::select! {
            biased;
            () = inbound.shutdown.as_mut(), if !draining => {
                self.pipeline.gen_gate.close();
                let timeout = self.options.shutdown_timeout;
                let deadline = begin_drain(&mut inbound.source, timeout).await;
                inbound.drain_timer.as_mut().reset(deadline);
                inbound.deadline = Some(deadline);
                Turn::Again
            }
            () = inbound.drain_timer.as_mut(), if draining => Turn::PastDeadline,
            done = until => Turn::Done(done),
            next = inbound.source.next(), if !inbound.closed => {
                match next {
                    Some(Admission::Admitted(admitted)) => {
                        inbound.waiting.push_back(admitted);
                        // And what else the source already holds, up to a
                        // batch, without a turn of this `select!` (and its
                        // shutdown check) each.
                        self.take_ready(inbound, BATCH - 1).await;
                    }
                    Some(Admission::OverBudget { delivery, bytes }) => {
                        self.refuse(delivery, bytes).await;
                    }
                    None => inbound.closed = true,
                }
                Turn::Again
            }
        }
    }

    /// The next batch's first delivery: the first waiting, else the next the
    /// source delivers. `None` when no more comes: the source has ended, or
    /// the drain's deadline passed.
    pub(super) async fn first<S: Future<Output = ()>>(
        &self,
        inbound: &mut Inbound<'_, S>,
    ) -> Option<Admitted> {
        loop {
            if let Some(admitted) = inbound.waiting.pop_front() {
                return Some(admitted);
            }
            if inbound.closed {
                source_ended(inbound.deadline.is_some());
                return None;
            }
            let arrival = std::pin::pin!(std::future::pending::<()>());
            if let Turn::PastDeadline = self.turn(inbound, arrival).await {
                return None;
            }
        }
    }

    /// Slots for the batch `first` opens, when it holds none of its own: its
    /// first result's, and as many more as wait behind it (up to a batch).
    /// Waiting for them all at once wakes the runner once per batch when
    /// every slot is taken (a burst), not once per finished result: a
    /// wake-up per finished result would be a noticeable share of the
    /// worker's CPU in bursts.
    /// `Err` when the drain's deadline passed first.
    pub(super) async fn slots_for<S: Future<Output = ()>>(
        &self,
        first: &Admitted,
        inbound: &mut Inbound<'_, S>,
    ) -> Result<Option<OwnedSemaphorePermit>, PastDeadline> {
        if first.slot.is_some() {
            return Ok(None);
        }
        // Only the batch's worth is looked at: `waiting` can hold a whole
        // burst.
        let behind = inbound.waiting.iter().take(BATCH - 1);
        let want =
            (1 + behind.filter(|a| a.slot.is_none()).count()).min(self.options.max_in_flight);
        let want = u32::try_from(want).unwrap_or(1);
        // One wait, kept across turns: its place in the queue for slots is
        // not lost while deliveries arrive.
        let acquire = Arc::clone(&self.limits.slots).acquire_many_owned(want);
        let mut acquire = std::pin::pin!(acquire);
        loop {
            match self.turn(inbound, acquire.as_mut()).await {
                // The slots are never closed.
                Turn::Done(slots) => return slots.map(Some).map_err(|_| PastDeadline),
                Turn::Again => {}
                Turn::PastDeadline => return Err(PastDeadline),
            }
        }
    }

    /// The batch `first` opens: it, then what waits, then whatever the
    /// source already holds, as long as there are slots for them (`slots`,
    /// else free ones). Slots in `slots` not used go back.
    pub(super) async fn fill<S: Future<Output = ()>>(
        &self,
        first: Admitted,
        mut slots: Option<OwnedSemaphorePermit>,
        inbound: &mut Inbound<'_, S>,
    ) -> Vec<Admitted> {
        // Room for a whole batch at once: grown one push at a time, it
        // moved its results 1, 2, 4, 8 and 16 at a time in a burst.
        let mut batch = Vec::with_capacity(BATCH);
        batch.push(with_slot(first, &mut slots));
        while batch.len() < BATCH {
            let admitted = match inbound.waiting.pop_front() {
                Some(admitted) => admitted,
                None => match inbound.source.ready() {
                    Some(Admission::Admitted(admitted)) => admitted,
                    Some(Admission::OverBudget { delivery, bytes }) => {
                        self.refuse(delivery, bytes).await;
                        continue;
                    }
                    None => break,
                },
            };
            if admitted.slot.is_some() || slots.is_some() {
                batch.push(with_slot(admitted, &mut slots));
                continue;
            }
            match Arc::clone(&self.limits.slots).try_acquire_owned() {
                Ok(slot) => batch.push(with_slot(admitted, &mut Some(slot))),
                Err(_) => {
                    inbound.waiting.push_front(admitted);
                    break;
                }
            }
        }
        batch
    }

    /// Moves up to `most` admissions the source already holds into
    /// `waiting` (answering those the byte budget refused); never waits.
    pub(super) async fn take_ready<S>(&self, inbound: &mut Inbound<'_, S>, most: usize) {
        for _ in 0..most {
            match inbound.source.ready() {
                Some(Admission::Admitted(admitted)) => inbound.waiting.push_back(admitted),
                Some(Admission::OverBudget { delivery, bytes }) => {
                    self.refuse(delivery, bytes).await;
                }
                None => break,
            }
        }
    }

    /// Answers a delivery the byte budget had no room for.
    async fn refuse(&self, delivery: Box<Delivery>, bytes: usize) {
        self.stats.received(1);
        let max = self.options.max_in_flight_bytes;
        let held = max.saturating_sub(self.limits.budget.available());
        let handled = self
            .pipeline
            .refuse_over_budget(delivery, bytes, held, max, &self.refusals)
            .await;
        self.stats.handled(&handled);
    }
}

/// `admitted` holding exactly one processing slot: its own if the source
/// took one, else one split off `slots`.
fn with_slot(mut admitted: Admitted, slots: &mut Option<OwnedSemaphorePermit>) -> Admitted {
    if admitted.slot.is_none() {
        admitted.slot = match slots {
            Some(all) if all.num_permits() > 1 => all.split(1),
            _ => slots.take(),
        };
    }
    admitted
}

/// Logs why no more input comes.
fn source_ended(draining: bool) {
    if draining {
        tracing::info!("shutdown: the source is drained; every accepted result is taken");
    } else {
        tracing::warn!("the transport closed; finishing the results already taken");
    }
}

/// Stops taking input; returns the instant by which in-flight work must end.
async fn begin_drain(source: &mut Source, timeout: Duration) -> Instant {
    let deadline = Instant::now() + timeout;
    tracing::info!(
        ?timeout,
        "shutdown: draining subscriptions or pulls (no new input; accepted results are still handled)"
    );
    if tokio::time::timeout_at(deadline, source.drain())
        .await
        .is_err()
    {
        tracing::warn!("shutdown: the transport did not accept the drain in time");
    }
    deadline
}
