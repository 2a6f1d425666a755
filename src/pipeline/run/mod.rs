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
//!
//! - `intake.rs`: the input side: the batch's first delivery, its slots and
//!   its filling, every wait on the input in one place (which also starts
//!   the drain).
//! - `batch.rs`: the task a batch runs in, per mode, and how a core-mode
//!   batch's results are counted once its outbox is sent.

mod batch;
mod intake;

use super::refuse::Refusals;
use super::{Pipeline, Stats};
use crate::config::Config;
use crate::transport::{Admitted, Limits, Source};
use batch::{handle, run_core_batch};
use intake::Inbound;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
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
    /// Over-budget refusals: the bytes they hold, their log.
    refusals: Refusals,
}

impl Runner {
    pub fn new(pipeline: Pipeline, options: Options) -> Runner {
        // One refused result of any allowed size, or the budget's worth.
        let allowance = options
            .max_in_flight_bytes
            .max(pipeline.rules.max_payload_bytes);
        Runner {
            pipeline: Arc::new(pipeline),
            limits: Limits::new(options.max_in_flight, options.max_in_flight_bytes),
            options,
            stats: Arc::new(Stats::default()),
            refusals: Refusals::new(allowance),
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
        // No result waits here for a GEN that refuses (`gen_gate`).
        self.pipeline.gen_gate.close();
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
