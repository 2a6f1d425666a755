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
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

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

/// The runner's input while it runs: the source, what was taken from it
/// while no slot was free, and the shutdown that ends the taking.
struct Inbound<'s, S> {
    source: Source,
    /// Taken from the source while no slot was free, in arrival order:
    /// first in the next batches. Bounded by the byte budget each holds.
    waiting: VecDeque<Admitted>,
    /// The source has ended: nothing more comes out of it.
    closed: bool,
    shutdown: Pin<&'s mut S>,
    /// Fires at `deadline` once draining started.
    drain_timer: Pin<&'s mut Sleep>,
    /// Set when draining starts: the instant by which in-flight work must end.
    deadline: Option<Instant>,
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
struct PastDeadline;

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
    ///
    /// Each turn: the batch's first delivery ([`Runner::first`]), the
    /// slots for the batch ([`Runner::slots_for`]), the batch filled
    /// ([`Runner::fill`]) and run in a task ([`Runner::spawn`]). Every wait
    /// on the input goes through [`Runner::turn`], which also starts the
    /// drain.
    pub async fn run(self, source: Source, shutdown: impl Future<Output = ()>) -> Report {
        let mut tasks = JoinSet::new();
        // Armed when draining starts; built once, not per message.
        let drain_timer = tokio::time::sleep(Duration::from_secs(365 * 24 * 3600));
        let mut inbound = Inbound {
            source,
            waiting: VecDeque::new(),
            closed: false,
            shutdown: std::pin::pin!(shutdown),
            drain_timer: std::pin::pin!(drain_timer),
            deadline: None,
        };
        loop {
            // Finished batches are collected a batch's worth at a time:
            // looked for on every turn, they would cost every result that
            // search at a moderate rate, where a batch is one result.
            if tasks.len() >= BATCH {
                while tasks.try_join_next().is_some() {}
            }
            let Some(first) = self.first(&mut inbound).await else {
                break;
            };
            // What the source already holds joins `waiting` first, so the
            // wait for slots knows how many a full batch would use.
            let room = (BATCH - 1).saturating_sub(inbound.waiting.len());
            self.take_ready(&mut inbound, room).await;
            // Past the drain deadline: not taken, it gets no output here.
            let Ok(slots) = self.slots_for(&first, &mut inbound).await else {
                break;
            };
            let batch = self.fill(first, slots, &mut inbound).await;
            self.stats.received(batch.len());
            self.spawn(&mut tasks, batch);
        }
        self.wind_down(tasks, inbound.deadline).await
    }

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
    async fn first<S: Future<Output = ()>>(
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
    async fn slots_for<S: Future<Output = ()>>(
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
    async fn fill<S: Future<Output = ()>>(
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

    /// Runs a batch in a task of its own.
    fn spawn(&self, tasks: &mut JoinSet<()>, batch: Vec<Admitted>) {
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

    /// After the last batch: finishes the tasks in flight until the drain's
    /// `deadline` (the shutdown timeout from now when the source closed by
    /// itself), flushes, and reports.
    async fn wind_down(&self, mut tasks: JoinSet<()>, deadline: Option<Instant>) -> Report {
        let timeout = self.options.shutdown_timeout;
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
    async fn take_ready<S>(&self, inbound: &mut Inbound<'_, S>, most: usize) {
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
