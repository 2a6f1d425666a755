//! The pull loop: take as many messages as there are free processing slots
//! (at most `jetstream.batch`), hand each to the [`Handler`] as its own task,
//! and pull again. Survives server restarts: a pull whose connection was
//! re-established, or that failed, is abandoned and the consumer reopened.
//!
//! On shutdown no new pull is sent; messages of the pull already under way
//! are still handled, so nothing delivered to this worker waits for its ack
//! wait to run out.

use super::handle::Handler;
use super::{JetStreamError, setup};
use crate::config::Config;
use crate::metrics::Readiness;
use crate::transport::budget::ByteBudget;
use async_nats::Client;
use async_nats::jetstream::{self, consumer::PullConsumer, context::ConsumerInfoErrorKind};
use futures::StreamExt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

/// How long one pull waits on the server for messages. Only idle workers
/// notice it: they send one pull request per period.
const PULL_EXPIRES: Duration = Duration::from_secs(2);
/// How often a pull under way checks whether the connection was re-established.
const RECONNECT_CHECK: Duration = Duration::from_millis(200);
/// Pause after a failed pull or reopen, so a broken server is not hammered.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Room for a message's subject and headers beyond its payload, which the
/// server counts against a pull's max_bytes.
const PULL_OVERHEAD: usize = 16 * 1024;
/// The status descriptions (409) the server ends a pull with when it has
/// served the pull in full: its max_bytes used up, or (nats-server 2.10 and
/// later, after a pull bounded in bytes) its batch complete. async-nats
/// reports them as errors carrying this text; for the worker they are the
/// pull's normal end. Read as errors, every pull on 2.15 reopened the
/// consumer after a 500 ms pause, and a backlog took minutes to drain.
const PULL_SERVED: [&str; 2] = ["Message Size Exceeds MaxBytes", "Batch Completed"];
/// How often an idle worker looks for acked messages the work queue kept
/// (see [`sweep`](super::sweep)).
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Where and how much to pull.
pub struct Puller {
    pub client: Client,
    pub js: jetstream::Context,
    pub config: Config,
    pub max_in_flight: usize,
    pub batch: usize,
    /// Bytes of messages held at once (`max_in_flight_bytes`): each pull asks
    /// for at most the bytes free, each message holds its size until settled.
    pub budget: ByteBudget,
    /// Marked consuming while pulls are sent, for `/readyz`.
    pub readiness: Option<Readiness>,
}

impl Puller {
    /// Opens the shared durable consumer; with `jetstream.create`, first
    /// creates what is missing (so a deleted consumer comes back).
    pub async fn open(&self) -> Result<PullConsumer, JetStreamError> {
        let js = &self.config.jetstream;
        if js.create {
            let report = setup::ensure(&self.js, &self.config).await?;
            for (object, change) in &report.objects {
                if *change != setup::Change::Unchanged {
                    info!(%object, %change, "JetStream setup");
                }
            }
        }
        let stream = self
            .js
            .get_stream_no_info(&js.prefill_stream)
            .await
            .map_err(|e| {
                JetStreamError::Api(format!("opening stream {}: {e}", js.prefill_stream))
            })?;
        let missing = |what: String| {
            JetStreamError::Missing(format!(
                "{what} does not exist; run `prefill-handoff setup` or set jetstream.create = true"
            ))
        };
        match stream.consumer_info(&js.consumer).await {
            Ok(_) => {}
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {
                return Err(missing(format!(
                    "consumer {}/{}",
                    js.prefill_stream, js.consumer
                )));
            }
            Err(e) if e.kind() == ConsumerInfoErrorKind::StreamNotFound => {
                return Err(missing(format!("stream {}", js.prefill_stream)));
            }
            Err(e) => {
                return Err(JetStreamError::Api(format!(
                    "reading consumer {}/{}: {e}",
                    js.prefill_stream, js.consumer
                )));
            }
        }
        let consumer = stream
            .get_consumer(&js.consumer)
            .await
            .map_err(|e| JetStreamError::Api(format!("opening consumer {}: {e}", js.consumer)))?;
        self.sweep().await;
        Ok(consumer)
    }

    async fn sweep(&self) {
        let js = &self.config.jetstream;
        if let Err(e) = super::sweep::orphans(&self.js, &js.prefill_stream, &js.consumer).await {
            debug!(error = %e, "work-queue sweep failed; trying again later");
        }
    }

    fn set_consuming(&self, consuming: bool) {
        if let Some(readiness) = &self.readiness {
            readiness.set_consuming(consuming);
        }
    }

    fn connects(&self) -> u64 {
        self.client.statistics().connects.load(Ordering::Acquire)
    }

    /// Pulls and handles messages until `shutdown` completes, then finishes
    /// the pull under way and the messages in flight, all within
    /// `drain_timeout` of the shutdown; messages still unsettled after it are
    /// redelivered by the server, nothing is lost.
    pub async fn run(
        &self,
        consumer: PullConsumer,
        handler: Arc<Handler>,
        shutdown: impl Future<Output = ()>,
        drain_timeout: Duration,
    ) {
        let slots = Arc::new(Semaphore::new(self.max_in_flight.max(1)));
        let mut tasks = JoinSet::new();
        let mut consumer = Some(consumer);
        // When shutdown came, if it did: the drain ends `drain_timeout` later.
        let mut stopped_at: Option<tokio::time::Instant> = None;
        let mut last_sweep = Instant::now();
        tokio::pin!(shutdown);
        self.set_consuming(true);
        while stopped_at.is_none() {
            while tasks.try_join_next().is_some() {}
            let current = match consumer.take() {
                Some(c) => c,
                None => {
                    tokio::select! {
                        opened = self.open() => match opened {
                            Ok(c) => c,
                            Err(e) => {
                                warn!(error = %e, "cannot open the JetStream consumer; retrying");
                                pause(&mut shutdown, &mut stopped_at).await;
                                continue;
                            }
                        },
                        () = &mut shutdown => break,
                    }
                }
            };
            // Pull only as many messages as can be worked on right now.
            let first = tokio::select! {
                permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                () = &mut shutdown => break,
            };
            let mut permits = vec![first];
            while permits.len() < self.batch.max(1) {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            // And only as many bytes as are free, waiting until the largest
            // accepted message would fit (a pull whose max_bytes is below the
            // next message's size gets nothing).
            let least = self.config.max_payload_bytes.saturating_add(PULL_OVERHEAD);
            let mut bytes = tokio::select! {
                held = self.budget.hold_free(least) => held,
                () = &mut shutdown => break,
            };
            let connects = self.connects();
            let pull = current
                .batch()
                .max_messages(permits.len())
                .max_bytes(bytes.bytes())
                .expires(PULL_EXPIRES)
                .messages()
                .await;
            let mut batch = match pull {
                Ok(batch) => batch,
                Err(e) => {
                    warn!(error = %e, "pull request failed; reopening the consumer");
                    drop(permits);
                    pause(&mut shutdown, &mut stopped_at).await;
                    continue;
                }
            };
            let mut healthy = true;
            let mut received = 0usize;
            let mut check = tokio::time::interval(RECONNECT_CHECK);
            loop {
                tokio::select! {
                    item = batch.next() => match item {
                        Some(Ok(message)) => {
                            received += 1;
                            let received_at = Instant::now();
                            let permit = match permits.pop() {
                                Some(p) => p,
                                None => acquire(&slots).await,
                            };
                            let held = bytes.split(message.length.max(message.payload.len()));
                            let handler = handler.clone();
                            tasks.spawn(async move {
                                handler.handle(message, received_at).await;
                                drop((permit, held));
                            });
                        }
                        Some(Err(e)) if PULL_SERVED.iter().any(|s| e.to_string().contains(s)) => {
                            debug!(status = %e, "pull served in full");
                            break;
                        }
                        Some(Err(e)) => {
                            warn!(error = %e, "pull ended with an error; reopening the consumer");
                            healthy = false;
                            break;
                        }
                        None => break,
                    },
                    _ = check.tick() => {
                        if self.connects() != connects {
                            // The server may have lost this pull with the old
                            // connection; pull again on the new one.
                            info!("NATS connection re-established; pulling again");
                            healthy = false;
                            break;
                        }
                    }
                    () = &mut shutdown, if stopped_at.is_none() => {
                        info!("shutdown: no new pulls; finishing the pull under way");
                        self.set_consuming(false);
                        stopped_at = Some(tokio::time::Instant::now());
                    }
                    () = sleep_until_drained(stopped_at, drain_timeout) => break,
                }
            }
            drop((permits, bytes));
            if healthy
                && received == 0
                && stopped_at.is_none()
                && last_sweep.elapsed() >= SWEEP_EVERY
            {
                self.sweep().await;
                last_sweep = Instant::now();
            }
            if healthy {
                consumer = Some(current);
            } else {
                pause(&mut shutdown, &mut stopped_at).await;
            }
        }
        self.set_consuming(false);
        let stopped_at = stopped_at.unwrap_or_else(tokio::time::Instant::now);
        drain(tasks, stopped_at + drain_timeout).await;
    }
}

async fn acquire(slots: &Arc<Semaphore>) -> OwnedSemaphorePermit {
    slots
        .clone()
        .acquire_owned()
        .await
        .expect("the semaphore is never closed")
}

/// Waits [`RETRY_PAUSE`], or less if shutdown comes first (then noted in
/// `stopped_at`). Returns at once when already stopping.
async fn pause(
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    stopped_at: &mut Option<tokio::time::Instant>,
) {
    if stopped_at.is_some() {
        return;
    }
    tokio::select! {
        () = tokio::time::sleep(RETRY_PAUSE) => {}
        () = shutdown.as_mut() => *stopped_at = Some(tokio::time::Instant::now()),
    }
}

/// Completes `drain_timeout` after shutdown came; never before it came.
async fn sleep_until_drained(stopped_at: Option<tokio::time::Instant>, drain_timeout: Duration) {
    match stopped_at {
        Some(at) => tokio::time::sleep_until(at + drain_timeout).await,
        None => std::future::pending().await,
    }
}

/// Waits for in-flight messages; aborts what is left at `deadline`.
async fn drain(mut tasks: JoinSet<()>, deadline: tokio::time::Instant) {
    let left = tasks.len();
    if left > 0 {
        info!(in_flight = left, "waiting for in-flight messages");
    }
    let all = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout_at(deadline, all).await.is_err() {
        warn!(
            unfinished = tasks.len(),
            "shutdown timeout: abandoning in-flight messages; the server redelivers them"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    } else {
        debug!("all in-flight messages settled");
    }
}
