//! The worker loop: take a prefill result from the transport, decide, publish
//! its one output, settle it; on shutdown stop taking input and finish what
//! was taken.
//!
//! - `intake.rs`: takes results off the transport into the byte budget, or
//!   refuses them when it is spent.
//! - `handle.rs`: one result, from bytes to published output.
//! - `settle.rs`: which settlement (ack, nak, term) follows what happened.
//! - [`shutdown`]: SIGTERM and SIGINT.
//! - [`stats`]: counts of received and published results, for the shutdown
//!   report and tests.
//!
//! Results are handled in spawned tasks, at most `max_in_flight` at once, so
//! decisions run on every runtime thread (handling all results inside the
//! loop's task measured ~20% slower on two cores). A task takes every result
//! already waiting, up to [`BATCH`], so a burst does not pay one spawn per
//! result. Publishing only enqueues on
//! the NATS connection, so outputs are pipelined and flushed once at
//! shutdown, not per message.

mod handle;
mod intake;
pub mod settle;
pub mod shutdown;
pub mod stats;

pub use handle::Handled;
pub use stats::{Counts, Stats};

use crate::config::{Config, Mode};
use crate::decision::Rules;
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::telemetry::Telemetry;
use crate::transport::budget::ByteBudget;
use crate::transport::{Inbound, Outbound};
use intake::{Admitted, Intake};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How the loop behaves; fixed for the worker's lifetime.
#[derive(Debug, Clone)]
pub struct Options {
    /// Results handled concurrently (1 to `u32::MAX`).
    pub max_in_flight: usize,
    /// Bytes of results held at once (see `intake`).
    pub max_in_flight_bytes: usize,
    /// How long shutdown may take to finish the results already taken.
    pub shutdown_timeout: Duration,
    /// Durable mode: a result that needs an ID while the worker holds no slot
    /// gets no output and is redelivered later, instead of an
    /// `identity_unavailable` error response.
    pub defer_when_fenced: bool,
}

impl Options {
    pub fn from_config(config: &Config) -> Options {
        Options {
            // A semaphore counts in u32 when waiting for all permits at once.
            max_in_flight: config.max_in_flight.clamp(1, u32::MAX as usize),
            max_in_flight_bytes: config.max_in_flight_bytes.clamp(1, u32::MAX as usize),
            shutdown_timeout: Duration::from_secs(config.shutdown_timeout_secs),
            defer_when_fenced: config.mode == Mode::Jetstream,
        }
    }
}

/// What the worker did, reported when it stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub counts: Counts,
    /// Results taken but not finished when the shutdown timeout ran out.
    pub unfinished: usize,
    /// Whether everything published reached the server before the end.
    pub flushed: bool,
}

pub struct Worker {
    rules: Rules,
    identity: Identity,
    metrics: Metrics,
    outbound: Outbound,
    options: Options,
    stats: Arc<Stats>,
    budget: ByteBudget,
    /// `None`: no tracing, and no span built per result.
    telemetry: Option<Telemetry>,
}

impl Worker {
    pub fn new(
        rules: Rules,
        identity: Identity,
        metrics: Metrics,
        outbound: Outbound,
        options: Options,
    ) -> Worker {
        Worker {
            rules,
            identity,
            metrics,
            outbound,
            budget: ByteBudget::new(options.max_in_flight_bytes),
            options,
            stats: Arc::new(Stats::default()),
            telemetry: None,
        }
    }

    /// Each result gets a span exported by `telemetry` (`None`: none).
    pub fn with_telemetry(mut self, telemetry: Option<Telemetry>) -> Worker {
        self.telemetry = telemetry;
        self
    }

    /// Live counters, readable while the worker runs.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Handles results from `inbound` until `shutdown` completes (or the
    /// transport closes), then drains: stops taking input, finishes every
    /// result already taken (bounded by the shutdown timeout) and flushes.
    pub async fn run(self, inbound: Inbound, shutdown: impl Future<Output = ()>) -> Report {
        let worker = Arc::new(self);
        let mut inbound = Intake::start(inbound, Arc::clone(&worker));
        let limit = worker.options.max_in_flight;
        let timeout = worker.options.shutdown_timeout;
        let permits = Arc::new(Semaphore::new(limit));
        let mut shutdown = std::pin::pin!(shutdown);
        // Armed when draining starts; built once, not per message.
        let drain_deadline = tokio::time::sleep(Duration::from_secs(365 * 24 * 3600));
        let mut drain_deadline = std::pin::pin!(drain_deadline);
        let mut deadline: Option<Instant> = None;

        loop {
            let draining = deadline.is_some();
            let permit = tokio::select! {
                biased;
                () = &mut shutdown, if !draining => {
                    let until = begin_drain(&mut inbound, timeout).await;
                    drain_deadline.as_mut().reset(until);
                    deadline = Some(until);
                    continue;
                }
                () = &mut drain_deadline, if draining => break,
                permit = Arc::clone(&permits).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break, // never closed
                },
            };
            let next = tokio::select! {
                biased;
                () = &mut shutdown, if !draining => {
                    let until = begin_drain(&mut inbound, timeout).await;
                    drain_deadline.as_mut().reset(until);
                    deadline = Some(until);
                    continue;
                }
                () = &mut drain_deadline, if draining => break,
                next = inbound.next() => next,
            };
            let Some(incoming) = next else {
                if draining {
                    tracing::info!(
                        "shutdown: subscriptions drained; every accepted result is taken"
                    );
                } else {
                    tracing::warn!("the transport closed; finishing the results already taken");
                }
                break;
            };
            let batch = take_ready(incoming, permit, &mut inbound, &permits);
            worker.stats.received(batch.results.len());
            let worker = Arc::clone(&worker);
            tokio::spawn(async move {
                for Admitted { incoming, held } in batch.results {
                    let handled = worker.handle(&incoming).await;
                    worker.stats.handled(&handled);
                    incoming.ack.settle(settle::settlement(&handled)).await;
                    // Its bytes count until its output is out.
                    drop(held);
                }
                drop(batch.permit);
            });
        }

        let deadline = deadline.unwrap_or_else(|| Instant::now() + timeout);
        tracing::info!(
            in_flight = limit - permits.available_permits(),
            "shutdown: finishing results in flight"
        );
        let all = u32::try_from(limit).unwrap_or(u32::MAX);
        let unfinished = match tokio::time::timeout_at(deadline, permits.acquire_many(all)).await {
            Ok(_) => 0,
            Err(_) => limit - permits.available_permits(),
        };
        if unfinished > 0 {
            tracing::error!(
                unfinished,
                ?timeout,
                "shutdown: the shutdown timeout ran out with results still in flight; they get no output"
            );
        }
        // Flushing gets what is left of the timeout, and at least a second.
        let flush_budget = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        tracing::info!("shutdown: flushing NATS");
        let flushed = worker.outbound.flush(flush_budget).await;
        let counts = worker.stats.counts();
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

/// Results handled by one task, at most. In a burst, spawning one task per
/// result cost more CPU than the decision itself; a batch shares one task
/// (and one wake-up) while each result still waits for at most `BATCH - 1`
/// others. At a moderate rate batches hold one result, as before.
const BATCH: usize = 32;

/// Results taken together, with one in-flight permit for each.
struct Batch {
    results: Vec<Admitted>,
    permit: OwnedSemaphorePermit,
}

/// `first`, plus every result the transport already holds, up to [`BATCH`]
/// and as many as there are free permits. Never waits.
fn take_ready(
    first: Admitted,
    mut permit: OwnedSemaphorePermit,
    inbound: &mut Intake,
    permits: &Arc<Semaphore>,
) -> Batch {
    let mut results = Vec::with_capacity(BATCH);
    results.push(first);
    while results.len() < BATCH {
        let Ok(more) = Arc::clone(permits).try_acquire_owned() else {
            break;
        };
        // A closed transport answers `None` on the loop's next call, which
        // ends the loop there.
        match inbound.ready() {
            Some(admitted) => {
                permit.merge(more);
                results.push(admitted);
            }
            None => break,
        }
    }
    Batch { results, permit }
}

/// Stops taking input; returns the instant by which in-flight work must end.
async fn begin_drain(inbound: &mut Intake, timeout: Duration) -> Instant {
    let deadline = Instant::now() + timeout;
    tracing::info!(
        ?timeout,
        "shutdown: draining subscriptions (no new input; accepted results are still handled)"
    );
    if tokio::time::timeout_at(deadline, inbound.drain())
        .await
        .is_err()
    {
        tracing::warn!("shutdown: the transport did not accept the drain in time");
    }
    deadline
}
