//! The pull loop: pull as many messages as there are free processing slots
//! (at most `jetstream.batch`) and free bytes, hand each on as an admitted
//! [`Delivery`], and pull again. Survives server restarts: a pull whose
//! connection was re-established, or that failed, is abandoned and the
//! consumer reopened.
//!
//! On drain no new pull is sent; messages of the pull already under way are
//! still handed on, so nothing delivered to this worker waits for its ack
//! wait to run out.

use super::OpenError;
use crate::transport::Held;
use crate::transport::{Admission, Admitted, Attempt, Delivery, Feed, Limits, Settler, Source};
use async_nats::Client;
use async_nats::jetstream::consumer::pull::Batch;
use async_nats::jetstream::{self, consumer::PullConsumer, context::ConsumerInfoErrorKind};
use futures::StreamExt;
use futures::future::BoxFuture;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc;
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

/// Creates the stream and consumer when they are missing (`jetstream.create`),
/// before each reopen, so a deleted consumer comes back. Its failures are
/// logged and retried.
pub type Ensure = Arc<
    dyn Fn() -> BoxFuture<'static, Result<(), Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + Sync,
>;

/// Told whether pulls are being sent (for `/readyz`).
pub type OnConsuming = Arc<dyn Fn(bool) + Send + Sync>;

/// Where and how much to pull.
pub struct Puller {
    pub client: Client,
    pub js: jetstream::Context,
    pub stream: String,
    pub consumer: String,
    /// Messages per pull, at most (`jetstream.batch`).
    pub batch: usize,
    /// The largest message accepted (`max_payload_bytes`): a pull waits
    /// until it would fit in the bytes free.
    pub max_payload: usize,
    /// The consumer's ack wait: in-progress acks are sent every half of it.
    pub ack_wait: Duration,
    /// How long the pull under way may still run after a drain.
    pub drain_timeout: Duration,
    pub ensure: Option<Ensure>,
    pub on_consuming: Option<OnConsuming>,
}

/// Opens the shared durable consumer `stream`/`consumer`.
pub async fn open(
    js: &jetstream::Context,
    stream: &str,
    consumer: &str,
) -> Result<PullConsumer, OpenError> {
    let handle = js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| OpenError::Api(format!("opening stream {stream}: {e}")))?;
    let missing = |what: String| {
        OpenError::Missing(format!(
            "{what} does not exist; run `prefill-handoff setup` or set jetstream.create = true"
        ))
    };
    match handle.consumer_info(consumer).await {
        Ok(_) => {}
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {
            return Err(missing(format!("consumer {stream}/{consumer}")));
        }
        Err(e) if e.kind() == ConsumerInfoErrorKind::StreamNotFound => {
            return Err(missing(format!("stream {stream}")));
        }
        Err(e) => {
            return Err(OpenError::Api(format!(
                "reading consumer {stream}/{consumer}: {e}"
            )));
        }
    }
    handle
        .get_consumer(consumer)
        .await
        .map_err(|e| OpenError::Api(format!("opening consumer {consumer}: {e}")))
}

/// Starts pulling from `consumer` (already opened): deliveries pulled from
/// the durable consumer, each admitted within the in-flight limits. A drain
/// stops new pulls; the pull under way is finished (within the drain timeout).
pub fn start(puller: Puller, consumer: PullConsumer, limits: Limits) -> Source {
    let (source, feed) = Source::new();
    let Feed { admitted, drain } = feed;
    let shutdown = async {
        if let Ok(done) = drain.await {
            // Accepted at once: the loop sends no new pull from here on.
            let _ = done.send(());
        }
    };
    tokio::spawn(async move { puller.run(consumer, limits, admitted, shutdown).await });
    source
}

impl Puller {
    async fn reopen(&self) -> Result<PullConsumer, OpenError> {
        if let Some(ensure) = &self.ensure {
            ensure().await.map_err(|e| OpenError::Api(e.to_string()))?;
        }
        let consumer = open(&self.js, &self.stream, &self.consumer).await?;
        self.sweep().await;
        Ok(consumer)
    }

    async fn sweep(&self) {
        if let Err(e) = super::sweep::orphans(&self.js, &self.stream, &self.consumer).await {
            debug!(error = %e, "work-queue sweep failed; trying again later");
        }
    }

    fn set_consuming(&self, consuming: bool) {
        if let Some(on_consuming) = &self.on_consuming {
            on_consuming(consuming);
        }
    }

    fn connects(&self) -> u64 {
        self.client.statistics().connects.load(Ordering::Acquire)
    }

    /// One pulled message as a delivery. The delivery count is in the ack
    /// subject; a message without one cannot come from a consumer, but
    /// counts as a first delivery.
    fn delivery(&self, message: jetstream::Message) -> Delivery {
        let (number, stored_at) = message
            .reply
            .as_deref()
            .and_then(|reply| super::ack_subject::attempt(reply.as_bytes()))
            .map_or((1, None), |(delivered, stored)| (delivered, Some(stored)));
        let (message, acker) = message.split();
        Delivery {
            subject: message.subject,
            payload: message.payload,
            headers: message.headers,
            // The NATS reply subject is the ack subject: it stays in the acker.
            reply: None,
            received_at: Instant::now(),
            attempt: Attempt { number, stored_at },
            settler: Settler::JetStream {
                acker: Box::new(acker),
                every: self.ack_wait / 2,
            },
        }
    }

    /// Pulls until `shutdown` completes, then finishes the pull under way
    /// within `drain_timeout`; messages not handed on by then are
    /// redelivered by the server, nothing is lost.
    async fn run(
        &self,
        consumer: PullConsumer,
        limits: Limits,
        out: mpsc::UnboundedSender<Admission>,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut consumer = Some(consumer);
        // When shutdown came, if it did: the drain ends `drain_timeout` later.
        let mut stopped_at: Option<tokio::time::Instant> = None;
        let mut last_sweep = Instant::now();
        let mut unopened = Unopened::default();
        tokio::pin!(shutdown);
        self.set_consuming(true);
        while stopped_at.is_none() {
            let current = match consumer.take() {
                Some(c) => c,
                None => match self
                    .open_again(&mut unopened, &mut shutdown, &mut stopped_at)
                    .await
                {
                    Reopened::Open(c) => *c,
                    Reopened::NotYet => continue,
                    Reopened::Shutdown => break,
                },
            };
            let Some((mut permits, mut bytes)) = self.room(&limits, &mut shutdown).await else {
                break;
            };
            let connects = self.connects();
            let pull = current
                .batch()
                .max_messages(permits.len())
                .max_bytes(bytes.bytes())
                .expires(PULL_EXPIRES)
                .messages()
                .await;
            let batch = match pull {
                Ok(batch) => batch,
                Err(e) => {
                    warn!(error = %e, "pull request failed; reopening the consumer");
                    drop(permits);
                    pause(&mut shutdown, &mut stopped_at).await;
                    continue;
                }
            };
            let pulled = Pull {
                permits: &mut permits,
                bytes: &mut bytes,
                connects,
            };
            let Some(ended) = self
                .hand_on(batch, pulled, &out, &mut shutdown, &mut stopped_at)
                .await
            else {
                break;
            };
            let (healthy, received) = (ended.healthy, ended.received);
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
    }

    /// Opens the consumer again; after a failure, pauses (counted and
    /// logged by `unopened`) before the caller tries again.
    async fn open_again(
        &self,
        unopened: &mut Unopened,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
        stopped_at: &mut Option<tokio::time::Instant>,
    ) -> Reopened {
        tokio::select! {
            opened = self.reopen() => match opened {
                Ok(c) => {
                    unopened.opened(self);
                    Reopened::Open(Box::new(c))
                }
                Err(e) => {
                    let wait = unopened.failed(self, &e);
                    pause_for(wait, shutdown, stopped_at).await;
                    Reopened::NotYet
                }
            },
            () = shutdown.as_mut() => Reopened::Shutdown,
        }
    }

    /// Room for the next pull: a slot for each message (at least one,
    /// waited for; up to a batch), and as many bytes as are free, waiting
    /// until the largest accepted message would fit (a pull whose max_bytes
    /// is below the next message's size gets nothing). `None` on shutdown.
    async fn room(
        &self,
        limits: &Limits,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Option<(Vec<OwnedSemaphorePermit>, Held)> {
        let slots = &limits.slots;
        let first = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.ok()?, // never closed
            () = shutdown.as_mut() => return None,
        };
        let mut permits = vec![first];
        while permits.len() < self.batch.max(1) {
            match slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let least = self.max_payload.saturating_add(PULL_OVERHEAD);
        let bytes = tokio::select! {
            held = limits.budget.hold_free(least) => held,
            () = shutdown.as_mut() => return None,
        };
        Some((permits, bytes))
    }

    /// Hands on each message of one pull, with a slot and its bytes, until
    /// the pull is served or fails, the connection is re-established (the
    /// server may have lost the pull with the old one), or the drain's time
    /// is up. `None` when the runner is gone.
    async fn hand_on(
        &self,
        mut batch: Batch,
        pull: Pull<'_>,
        out: &mpsc::UnboundedSender<Admission>,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
        stopped_at: &mut Option<tokio::time::Instant>,
    ) -> Option<PullEnded> {
        let mut ended = PullEnded {
            healthy: true,
            received: 0,
        };
        let mut check = tokio::time::interval(RECONNECT_CHECK);
        loop {
            tokio::select! {
                item = batch.next() => match item {
                    Some(Ok(message)) => {
                        ended.received += 1;
                        let held = pull.bytes.split(message.length.max(message.payload.len()));
                        // Without a slot left (the server sent more than
                        // asked), the runner takes one for it.
                        let slot = pull.permits.pop();
                        let delivery = Box::new(self.delivery(message));
                        let admitted = Admitted { delivery, held, slot };
                        out.send(Admission::Admitted(admitted)).ok()?;
                    }
                    Some(Err(e)) if PULL_SERVED.iter().any(|s| e.to_string().contains(s)) => {
                        debug!(status = %e, "pull served in full");
                        return Some(ended);
                    }
                    Some(Err(e)) => {
                        warn!(error = %e, "pull ended with an error; reopening the consumer");
                        ended.healthy = false;
                        return Some(ended);
                    }
                    None => return Some(ended),
                },
                _ = check.tick() => {
                    if self.connects() != pull.connects {
                        info!("NATS connection re-established; pulling again");
                        ended.healthy = false;
                        return Some(ended);
                    }
                }
                () = shutdown.as_mut(), if stopped_at.is_none() => {
                    info!("shutdown: no new pulls; finishing the pull under way");
                    self.set_consuming(false);
                    *stopped_at = Some(tokio::time::Instant::now());
                }
                () = sleep_until_drained(*stopped_at, self.drain_timeout) => return Some(ended),
            }
        }
    }
}

/// One pull under way: the slots and bytes it was asked with, and the
/// connection count when it was asked.
struct Pull<'a> {
    permits: &'a mut Vec<OwnedSemaphorePermit>,
    bytes: &'a mut Held,
    connects: u64,
}

/// How a pull ended: whether the consumer can pull again, and how many
/// messages it gave.
struct PullEnded {
    healthy: bool,
    received: usize,
}

/// Waits [`RETRY_PAUSE`], or less if shutdown comes first (then noted in
/// `stopped_at`). Returns at once when already stopping.
async fn pause(
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    stopped_at: &mut Option<tokio::time::Instant>,
) {
    pause_for(RETRY_PAUSE, shutdown, stopped_at).await;
}

/// Waits `wait`, or less if shutdown comes first, as [`pause`].
async fn pause_for(
    wait: Duration,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    stopped_at: &mut Option<tokio::time::Instant>,
) {
    if stopped_at.is_some() {
        return;
    }
    tokio::select! {
        () = tokio::time::sleep(wait) => {}
        () = shutdown.as_mut() => *stopped_at = Some(tokio::time::Instant::now()),
    }
}

/// The consumer failing to open, once or more in a row: a stream or
/// consumer deleted under the worker (and not to be created, or not
/// creatable), or the server not answering. Meanwhile the worker takes no
/// input, so it is not consuming (`/readyz`); the reason is logged when it
/// starts or changes, not on every try, and the tries slow down from
/// [`RETRY_PAUSE`] to [`REOPEN_PAUSE_MAX`].
#[derive(Default)]
struct Unopened {
    /// Failures in a row.
    failures: u32,
    /// The last reason logged.
    reason: String,
}

/// The longest pause between two tries to open a consumer that failed.
const REOPEN_PAUSE_MAX: Duration = Duration::from_secs(5);

impl Unopened {
    /// One more failure; returns how long to wait before the next try.
    fn failed(&mut self, puller: &Puller, e: &OpenError) -> Duration {
        if self.failures == 0 {
            puller.set_consuming(false);
        }
        self.failures = self.failures.saturating_add(1);
        let reason = e.to_string();
        if reason != self.reason {
            warn!(error = %reason, "cannot open the JetStream consumer; not consuming, trying again");
            self.reason = reason;
        } else {
            debug!(error = %reason, failures = self.failures, "cannot open the JetStream consumer");
        }
        let doublings = self.failures.saturating_sub(1).min(4);
        RETRY_PAUSE
            .saturating_mul(1 << doublings)
            .min(REOPEN_PAUSE_MAX)
    }

    /// Opened: consuming again, if it had failed.
    fn opened(&mut self, puller: &Puller) {
        if self.failures > 0 {
            info!(
                failures = self.failures,
                "JetStream consumer open again; consuming"
            );
            puller.set_consuming(true);
        }
        *self = Unopened::default();
    }
}

/// Completes `drain_timeout` after shutdown came; never before it came.
async fn sleep_until_drained(stopped_at: Option<tokio::time::Instant>, drain_timeout: Duration) {
    match stopped_at {
        Some(at) => tokio::time::sleep_until(at + drain_timeout).await,
        None => std::future::pending().await,
    }
}

/// What [`Puller::open_again`] came to.
enum Reopened {
    /// Boxed: a consumer is a kilobyte, the other variants nothing.
    Open(Box<PullConsumer>),
    /// Failed, and paused: try again.
    NotYet,
    Shutdown,
}
