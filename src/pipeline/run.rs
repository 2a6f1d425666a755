//! The runner, for both delivery modes: take deliveries from the source
//! within the in-flight limits, run each through the [`Pipeline`], and on
//! shutdown stop taking input, finish what was taken (within
//! `shutdown_timeout_secs`) and flush.
//!
//! The limits are the same in both modes: at most `max_in_flight`
//! deliveries and `max_in_flight_bytes` bytes of them at once. The source
//! admits within them (core NATS refuses what the byte budget has no room
//! for; JetStream pulls only what fits, the server keeps the rest).
//!
//! Deliveries are handled in spawned tasks, so that with a pool of several
//! threads (`TOKIO_WORKER_THREADS`) decisions run on all of them; the
//! default pool is one thread (`cli/run.rs`), where the tasks keep the loop
//! free to take input between batches. A task takes every delivery already
//! waiting, up to `BATCH`, so a burst does not pay one spawn per result. In
//! JetStream mode they run concurrently inside it, so a slow confirmation
//! holds up none of the others; in core mode, where publishing only
//! enqueues, one after the other (cheaper per result than a future set).
//!
//! When every slot is taken (a burst), the runner waits for as many slots as
//! its next batch will use, not for one: a wake-up per finished result
//! would be a noticeable share of the worker's CPU in bursts. Core
//! mode's batches give their slots and bytes back together at their end.

use super::{Handled, Pipeline, Stats};
use crate::config::Config;
use crate::metrics::RateLimitedLog;
use crate::transport::{Admission, Admitted, Held, Limits, Outbox, Source};
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How the runner behaves; fixed for the worker's lifetime.
#[derive(Debug, Clone)]
pub struct Options {
    /// Deliveries handled concurrently (1 to `u32::MAX`).
    pub max_in_flight: usize,
    /// Bytes of deliveries held at once.
    pub max_in_flight_bytes: usize,
    /// How long shutdown may take to finish the deliveries already taken.
    pub shutdown_timeout: Duration,
}

impl Options {
    pub fn from_config(config: &Config) -> Options {
        Options {
            max_in_flight: config.max_in_flight.clamp(1, u32::MAX as usize),
            max_in_flight_bytes: config.max_in_flight_bytes.clamp(1, u32::MAX as usize),
            shutdown_timeout: Duration::from_secs(config.shutdown_timeout_secs),
        }
    }
}

/// What the runner did, reported when it stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub counts: super::Counts,
    /// Deliveries taken but not finished when the shutdown timeout ran out
    /// (abandoned: JetStream redelivers them, core NATS loses them).
    pub unfinished: usize,
    /// Whether everything published reached the server before the end.
    pub flushed: bool,
}

/// Deliveries handled by one task, at most. In a burst, spawning one task
/// per result cost more CPU than the decision itself; a batch shares one
/// task (and one wake-up). At a moderate rate batches hold one result.
const BATCH: usize = 32;

pub struct Runner {
    pipeline: Arc<Pipeline>,
    options: Options,
    limits: Limits,
    stats: Arc<Stats>,
    /// Over-budget refusals, logged at most once per 10 s.
    refusals: RateLimitedLog,
}

impl Runner {
    pub fn new(pipeline: Pipeline, options: Options) -> Runner {
        Runner {
            pipeline: Arc::new(pipeline),
            limits: Limits::new(options.max_in_flight, options.max_in_flight_bytes),
            options,
            stats: Arc::new(Stats::default()),
            refusals: RateLimitedLog::default(),
        }
    }

    /// The limits the source must admit within.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Live counters, readable while the runner runs.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Handles deliveries from `source` until `shutdown` completes (or the
    /// source closes), then drains: stops taking input, finishes every
    /// delivery already taken (bounded by the shutdown timeout) and flushes.
    pub async fn run(self, mut source: Source, shutdown: impl Future<Output = ()>) -> Report {
        let timeout = self.options.shutdown_timeout;
        let mut tasks = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        // Armed when draining starts; built once, not per message.
        let drain_deadline = tokio::time::sleep(Duration::from_secs(365 * 24 * 3600));
        let mut drain_deadline = std::pin::pin!(drain_deadline);
        let mut deadline: Option<Instant> = None;

        // Taken from the source while no slot was free, in arrival order:
        // first in the next batches. Bounded by the byte budget each holds.
        let mut waiting: VecDeque<Admitted> = VecDeque::new();
        // The source has ended: nothing more comes out of it.
        let mut closed = false;
        loop {
            // Finished batches are collected a batch's worth at a time:
            // looked for on every turn, they would cost every result that
            // search at a moderate rate, where a batch is one result.
            if tasks.len() >= BATCH {
                while tasks.try_join_next().is_some() {}
            }
            let first = match waiting.pop_front() {
                Some(admitted) => admitted,
                None if closed => {
                    source_ended(deadline.is_some());
                    break;
                }
                None => {
                    let draining = deadline.is_some();
                    let next = tokio::select! {
                        biased;
                        () = &mut shutdown, if !draining => {
                            let until = begin_drain(&mut source, timeout).await;
                            drain_deadline.as_mut().reset(until);
                            deadline = Some(until);
                            continue;
                        }
                        () = &mut drain_deadline, if draining => break,
                        next = source.next() => next,
                    };
                    match next {
                        Some(Admission::Admitted(admitted)) => admitted,
                        Some(Admission::OverBudget { delivery, bytes }) => {
                            self.refuse(delivery, bytes).await;
                            continue;
                        }
                        None => {
                            source_ended(draining);
                            break;
                        }
                    }
                }
            };
            // What the source already holds joins `waiting` first, so the
            // wait below knows how many slots a full batch would use.
            let room = (BATCH - 1).saturating_sub(waiting.len());
            self.take_ready(&mut source, &mut waiting, room).await;
            // Slots for the batch: its first result's, and as many more as
            // wait behind it (up to a batch). Waiting for them all at once
            // wakes this loop once per batch when every slot is taken (a
            // burst), not once per finished result: a wake-up per result
            // cost about a tenth of the worker's CPU in bursts.
            let mut slots = if first.slot.is_some() {
                None
            } else {
                // Only the batch's worth is looked at: `waiting` can hold a
                // whole burst.
                let behind = waiting.iter().take(BATCH - 1);
                let want = (1 + behind.filter(|a| a.slot.is_none()).count())
                    .min(self.options.max_in_flight);
                let want = u32::try_from(want).unwrap_or(1);
                // One wait, kept across the loop: its place in the queue for
                // slots is not lost while deliveries arrive.
                let acquire = Arc::clone(&self.limits.slots).acquire_many_owned(want);
                let mut acquire = std::pin::pin!(acquire);
                let slots = loop {
                    tokio::select! {
                        biased;
                        () = &mut shutdown, if deadline.is_none() => {
                            let until = begin_drain(&mut source, timeout).await;
                            drain_deadline.as_mut().reset(until);
                            deadline = Some(until);
                        }
                        () = &mut drain_deadline, if deadline.is_some() => break None,
                        slots = &mut acquire => break slots.ok(),
                        // Reading goes on while every slot is taken: what
                        // arrives waits here, counted in the byte budget
                        // (or refused by it), not in the NATS client's
                        // buffer, which only a count of messages bounds.
                        next = source.next(), if !closed => match next {
                            Some(Admission::Admitted(admitted)) => {
                                waiting.push_back(admitted);
                                // And what else the source already holds, up
                                // to a batch, without a turn of this
                                // `select!` (and its shutdown check) each.
                                self.take_ready(&mut source, &mut waiting, BATCH - 1).await;
                            }
                            Some(Admission::OverBudget { delivery, bytes }) => {
                                self.refuse(delivery, bytes).await;
                            }
                            None => closed = true,
                        },
                    }
                };
                // Past the drain deadline: not taken, it gets no output here.
                let Some(slots) = slots else { break };
                Some(slots)
            };
            // Room for a whole batch at once: grown one push at a time, it
            // moved its results 1, 2, 4, 8 and 16 at a time in a burst.
            let mut batch = Vec::with_capacity(BATCH);
            batch.push(with_slot(first, &mut slots));
            // What waits, then whatever the source already holds, joins the
            // batch, as long as there are slots for it.
            while batch.len() < BATCH {
                let admitted = match waiting.pop_front() {
                    Some(admitted) => admitted,
                    None => match source.ready() {
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
                        waiting.push_front(admitted);
                        break;
                    }
                }
            }
            // Slots waited for but not used go back now.
            drop(slots);
            self.stats.received(batch.len());
            let pipeline = Arc::clone(&self.pipeline);
            let stats = Arc::clone(&self.stats);
            if self.pipeline.sink.confirms() {
                // Each result's slot and bytes go back as soon as it is
                // settled: a slow confirmation holds up no other.
                tasks.spawn(async move {
                    let handle = batch
                        .into_iter()
                        .map(|admitted| handle(&pipeline, &stats, admitted));
                    futures::future::join_all(handle).await;
                });
            } else {
                // Publishing only enqueues: one after the other costs no
                // waiting, and spares a future set per batch. The batch's
                // outputs go into its outbox and leave together at its end;
                // its slots and bytes go back together once they are out
                // (one release instead of two per result; a batch is a few
                // microseconds). Boxed: the task's future is moved on
                // spawning and again as the task changes stage; inline,
                // each move copied it whole.
                tasks.spawn(Box::pin(run_core_batch(pipeline, stats, batch)));
            }
        }

        let deadline = deadline.unwrap_or_else(|| Instant::now() + timeout);
        let unfinished = finish(&mut tasks, deadline, &self.stats).await;
        if unfinished > 0 {
            tracing::error!(
                unfinished,
                ?timeout,
                "shutdown: the shutdown timeout ran out with results still in flight; they get no output here (JetStream redelivers them)"
            );
        }
        // Flushing gets what is left of the timeout, and at least a second.
        let flush_budget = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        tracing::info!("shutdown: flushing NATS");
        let flushed = self.pipeline.sink.flush(flush_budget).await;
        let counts = self.stats.counts();
        tracing::info!(
            received = counts.received,
            published = counts.published,
            failed = counts.failed,
            deferred = counts.deferred,
            unfinished,
            flushed,
            "worker stopped"
        );
        Report {
            counts,
            unfinished,
            flushed,
        }
    }

    /// Moves up to `most` admissions the source already holds into
    /// `waiting` (answering those the byte budget refused); never waits.
    async fn take_ready(&self, source: &mut Source, waiting: &mut VecDeque<Admitted>, most: usize) {
        for _ in 0..most {
            match source.ready() {
                Some(Admission::Admitted(admitted)) => waiting.push_back(admitted),
                Some(Admission::OverBudget { delivery, bytes }) => {
                    self.refuse(delivery, bytes).await;
                }
                None => break,
            }
        }
    }

    /// Answers a delivery the byte budget had no room for.
    async fn refuse(&self, delivery: Box<crate::transport::Delivery>, bytes: usize) {
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

/// Runs a core-mode batch: each delivery through the pipeline, one after
/// the other, their outputs into one outbox; then sends the outbox and
/// counts each result by whether its output went out.
async fn run_core_batch(pipeline: Arc<Pipeline>, stats: Arc<Stats>, batch: Vec<Admitted>) {
    let mut outbox = Outbox::with_capacity(batch.len());
    let mut results = Vec::with_capacity(batch.len());
    let mut slots: Option<OwnedSemaphorePermit> = None;
    let mut bytes = Held::default();
    for admitted in batch {
        let Admitted {
            delivery,
            held,
            slot,
        } = admitted;
        bytes.merge(held);
        match (&mut slots, slot) {
            (Some(all), Some(slot)) => all.merge(slot),
            (all, slot) => *all = all.take().or(slot),
        }
        results.push(pipeline.handle(delivery, Some(&mut outbox)).await);
    }
    let queued = outbox.len();
    let out = pipeline.sink.send(outbox).await;
    if out < queued {
        tracing::error!(
            lost = queued - out,
            "the NATS client has closed: a batch's outputs could not be queued; these results have none"
        );
    }
    for handled in count_sent(results, out, &pipeline.metrics) {
        stats.handled(&handled);
    }
    // Released once the outputs are out.
    drop((bytes, slots));
}

/// A batch's results as counted once its outbox is sent: the queued ones,
/// in order, published for the first `out` (which went out) and failed for
/// the rest (lost with the client); each queued result put exactly one
/// output in the outbox, in the same order.
pub(crate) fn count_sent(
    results: Vec<Handled>,
    out: usize,
    metrics: &crate::metrics::Metrics,
) -> impl Iterator<Item = Handled> {
    let mut nth = 0;
    results.into_iter().map(move |handled| match handled {
        Handled::Queued(queued) => {
            nth += 1;
            queued.count(metrics, nth <= out)
        }
        other => other,
    })
}

/// Runs one delivery through the pipeline; its bytes and its slot count
/// until it is settled.
async fn handle(pipeline: &Pipeline, stats: &Stats, admitted: Admitted) {
    let Admitted {
        delivery,
        held,
        slot,
    } = admitted;
    stats.handled(&pipeline.handle(delivery, None).await);
    drop((held, slot));
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

/// Waits for the tasks in flight until `deadline`, then abandons the rest.
/// Returns how many deliveries were abandoned.
async fn finish(tasks: &mut JoinSet<()>, deadline: Instant, stats: &Stats) -> usize {
    tracing::info!(tasks = tasks.len(), "shutdown: finishing results in flight");
    let all = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout_at(deadline, all).await.is_ok() {
        return 0;
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let counts = stats.counts();
    let done = counts.published + counts.failed + counts.deferred;
    usize::try_from(counts.received.saturating_sub(done)).unwrap_or(usize::MAX)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{DeadLetterCode, Outcome};
    use crate::metrics::Metrics;

    fn queued(code: DeadLetterCode) -> Handled {
        Handled::Queued(super::super::Queued {
            outcome: Outcome::DeadLetter { code },
            trailing_frames: 0,
            received_at: std::time::Instant::now(),
        })
    }

    fn batch() -> Vec<Handled> {
        let failed = Outcome::DeadLetter {
            code: DeadLetterCode::TooLarge,
        };
        vec![
            queued(DeadLetterCode::Malformed),
            Handled::Failed(failed),
            queued(DeadLetterCode::MissingReplyTo),
            queued(DeadLetterCode::OverBudget),
        ]
    }

    fn published(counted: &[Handled]) -> usize {
        let published = counted
            .iter()
            .filter(|h| matches!(h, Handled::Published(_)));
        published.count()
    }

    #[test]
    fn a_batch_whose_client_is_gone_counts_nothing_as_published() {
        let metrics = Metrics::new();
        let counted: Vec<Handled> = count_sent(batch(), 0, &metrics).collect();
        assert_eq!(published(&counted), 0, "{counted:?}");
        assert!(counted.iter().all(|h| matches!(h, Handled::Failed(_))));
        let text = metrics.encode();
        let value = |name: &str| {
            let line = text.lines().find(|l| l.starts_with(name));
            line.and_then(|l| l.rsplit(' ').next()).map(str::to_string)
        };
        let no_output = value("handoff_dead_letters_total{code=\"malformed\"}");
        assert_eq!(no_output.as_deref(), Some("0"), "{text}");
        let failures = value("handoff_publish_failures_total");
        assert_eq!(failures.as_deref(), Some("3"), "{text}");
    }

    #[test]
    fn the_first_outputs_out_are_counted_published_in_order() {
        let metrics = Metrics::new();
        let counted: Vec<Handled> = count_sent(batch(), 2, &metrics).collect();
        let kinds: Vec<&str> = counted
            .iter()
            .map(|h| match h {
                Handled::Published(_) => "published",
                Handled::Failed(_) => "failed",
                Handled::Deferred(_) => "deferred",
                Handled::Queued(_) => "queued",
            })
            .collect();
        assert_eq!(kinds, ["published", "failed", "published", "failed"]);
    }
}
