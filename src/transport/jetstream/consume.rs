//! The pull loop: pulls sent ahead on one long-lived inbox, as many as the
//! free processing slots (at most `jetstream.batch` per pull) and free bytes
//! allow, so that the next messages are on their way while the last ones are
//! processed and the round trip to the server is hidden. Each delivery is
//! handed on admitted, with the slot and bytes its pull held
//! ([`pulls`](super::pulls)). Survives server restarts: when the connection
//! is re-established, or a pull fails, the pulls under way are forgotten and
//! the consumer reopened.
//!
//! On drain no new pull is sent; messages of the pulls already under way are
//! still handed on until they have all ended (or the drain's time is up), so
//! nothing delivered to this worker waits for its ack wait to run out.

use super::OpenError;
use super::open::open;
use super::pulls::{PullEnd, Pulls, Taken};
use crate::transport::{Admission, Admitted, Attempt, Delivery, Feed, Limits, Settler, Source};
use async_nats::jetstream::{self, consumer::PullConsumer};
use async_nats::{Client, Subscriber};
use futures::StreamExt;
use futures::future::BoxFuture;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// How long one pull waits on the server for messages. Only idle workers
/// notice it: they send their pulls again once per period.
const PULL_EXPIRES: Duration = Duration::from_secs(2);
/// How long past its expiry a pull is waited for before its end is taken as
/// lost with the connection.
const PULL_GRACE: Duration = Duration::from_secs(1);
/// How often the loop checks whether the connection was re-established and
/// whether a pull's end is overdue.
const RECONNECT_CHECK: Duration = Duration::from_millis(200);
/// Pause after a failed pull or reopen, so a broken server is not hammered.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Room for a message's subject and headers beyond its payload, which the
/// server counts against a pull's max_bytes.
const PULL_OVERHEAD: usize = 16 * 1024;
/// The JetStream API prefix the worker's context uses (no domain).
const API_PREFIX: &str = "$JS.API";
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

/// Starts pulling from `consumer` (already opened, which proves it exists;
/// the pulls name it by stream and consumer): deliveries pulled from the
/// durable consumer, each admitted within the in-flight limits. A drain
/// stops new pulls; the pulls under way are finished (within the drain
/// timeout).
pub fn start(puller: Puller, consumer: PullConsumer, limits: Limits) -> Source {
    drop(consumer);
    let (source, feed) = Source::new();
    let Feed { admitted, drain } = feed;
    let shutdown = async {
        if let Ok(done) = drain.await {
            // Accepted at once: the loop sends no new pull from here on.
            let _ = done.send(());
        }
    };
    tokio::spawn(async move { puller.run(limits, admitted, shutdown).await });
    source
}

/// The loop's state between events.
struct State {
    pulls: Pulls,
    /// Whether the consumer is open; false after a failure, until reopened.
    opened: bool,
    /// The connection count the pulls under way were sent on.
    connects: u64,
    /// The largest message seen: sizes each pull's max_bytes.
    largest: usize,
    last_message: Instant,
    last_sweep: Instant,
    /// The consumer failing to open, and how long to wait before the next
    /// try (from [`RETRY_PAUSE`], growing while it keeps failing).
    unopened: Unopened,
    next_open: Duration,
}

impl State {
    /// Forgets the pulls under way and reopens the consumer after a pause.
    fn failed(&mut self) {
        self.pulls.clear();
        self.opened = false;
    }
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

    /// The bytes a pull must be able to ask for: the largest accepted
    /// message, with room for its subject and headers (a pull whose
    /// max_bytes is below the next message's size gets nothing).
    fn least_bytes(&self) -> usize {
        self.max_payload.saturating_add(PULL_OVERHEAD)
    }

    /// Pulls until `shutdown` completes, then finishes the pulls under way
    /// within `drain_timeout`; messages not handed on by then are
    /// redelivered by the server, nothing is lost.
    async fn run(
        &self,
        limits: Limits,
        out: mpsc::UnboundedSender<Admission>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        // When shutdown came, if it did: the drain ends `drain_timeout` later.
        let mut stopped_at: Option<tokio::time::Instant> = None;
        self.set_consuming(true);
        // One inbox for every pull; each pull's reply subject is
        // `{inbox}.{id}`, where the server sends its end.
        let inbox = self.client.new_inbox();
        let mut inbox_sub = loop {
            match self.client.subscribe(format!("{inbox}.*")).await {
                Ok(sub) => break sub,
                Err(e) => {
                    warn!(error = %e, "cannot subscribe to the pull inbox; retrying");
                    pause(&mut shutdown, &mut stopped_at).await;
                    if stopped_at.is_some() {
                        self.set_consuming(false);
                        return;
                    }
                }
            }
        };
        let mut state = State {
            pulls: Pulls::default(),
            opened: true,
            connects: self.connects(),
            largest: self.max_payload,
            last_message: Instant::now(),
            last_sweep: Instant::now(),
            unopened: Unopened::default(),
            next_open: RETRY_PAUSE,
        };
        let mut check = tokio::time::interval(RECONNECT_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if stopped_at.is_some() && !state.pulls.under_way() {
                break;
            }
            if stopped_at.is_none() && !state.opened {
                self.reopen_after_pause(&mut state, &mut shutdown, &mut stopped_at)
                    .await;
                continue;
            }
            if stopped_at.is_none() {
                self.pull_ahead(&limits, &inbox, &mut state).await;
            }
            let wait_for_room = stopped_at.is_none() && state.opened && !state.pulls.under_way();
            tokio::select! {
                item = inbox_sub.next() => match item {
                    Some(message) => {
                        if !self.received(message, &limits, &mut state, &out) {
                            break; // the runner is gone
                        }
                    }
                    None => break, // the client closed
                },
                () = room(&limits, self.least_bytes()), if wait_for_room => {}
                _ = check.tick() => self.check(&mut state, stopped_at.is_none()).await,
                () = shutdown.as_mut(), if stopped_at.is_none() => {
                    info!("shutdown: no new pulls; finishing the pulls under way");
                    self.set_consuming(false);
                    stopped_at = Some(tokio::time::Instant::now());
                }
                () = sleep_until_drained(stopped_at, self.drain_timeout) => break,
            }
        }
        unsubscribe(inbox_sub).await;
        self.set_consuming(false);
    }

    /// Reopens the consumer after a pause (creating it first when
    /// `jetstream.create` is set), unless shutdown comes first. While it
    /// keeps failing, [`Unopened`] makes the worker not consuming, logs the
    /// reason when it changes and lengthens the pause.
    async fn reopen_after_pause(
        &self,
        state: &mut State,
        shutdown: &mut Pin<&mut impl Future<Output = ()>>,
        stopped_at: &mut Option<tokio::time::Instant>,
    ) {
        pause_for(state.next_open, shutdown, stopped_at).await;
        if stopped_at.is_some() {
            return;
        }
        tokio::select! {
            opened = self.reopen() => match opened {
                Ok(_) => {
                    state.unopened.opened(self);
                    state.next_open = RETRY_PAUSE;
                    state.opened = true;
                    state.connects = self.connects();
                }
                Err(e) => state.next_open = state.unopened.failed(self, &e),
            },
            () = shutdown.as_mut() => *stopped_at = Some(tokio::time::Instant::now()),
        }
    }

    /// Sends pulls while there is room for one: while pulls are under way,
    /// only once half a batch of slots is free, so that pulls stay large;
    /// with none under way, as soon as one slot is.
    async fn pull_ahead(&self, limits: &Limits, inbox: &str, state: &mut State) {
        let batch = self.batch.clamp(1, limits.max_in_flight);
        let least = self.least_bytes();
        // Enough bytes for a few pulls at once, each asking for at least
        // the largest accepted message.
        let most = (limits.budget.max() / 4).max(least);
        loop {
            let free = limits.slots.available_permits();
            let enough = if state.pulls.under_way() {
                batch / 2
            } else {
                1
            };
            if free < enough.max(1) {
                return;
            }
            let n = free.min(batch);
            let want = n
                .saturating_mul(state.largest.saturating_add(PULL_OVERHEAD / 16))
                .clamp(least, most);
            let free_bytes = limits.budget.available();
            let Some(bytes) = limits.budget.try_hold(want.min(free_bytes)) else {
                return;
            };
            if bytes.bytes() < least.min(limits.budget.max()) {
                return;
            }
            let Ok(slots) = Arc::clone(&limits.slots).try_acquire_many_owned(n as u32) else {
                return;
            };
            let max_bytes = bytes.bytes();
            let id = state.pulls.sent(slots, bytes, PULL_EXPIRES + PULL_GRACE);
            let request = format!(
                r#"{{"batch":{n},"max_bytes":{max_bytes},"expires":{}}}"#,
                PULL_EXPIRES.as_nanos()
            );
            let subject = format!(
                "{API_PREFIX}.CONSUMER.MSG.NEXT.{}.{}",
                self.stream, self.consumer
            );
            let reply = format!("{inbox}.{id}");
            let sent = self
                .client
                .publish_with_reply(subject, reply, request.into())
                .await;
            if let Err(e) = sent {
                warn!(error = %e, "pull request failed; reopening the consumer");
                state.failed();
                return;
            }
        }
    }

    /// Hands on a delivered message, or reads a pull's end. False when the
    /// runner is gone.
    fn received(
        &self,
        message: async_nats::Message,
        limits: &Limits,
        state: &mut State,
        out: &mpsc::UnboundedSender<Admission>,
    ) -> bool {
        if let Some(status) = super::pulls::server_status(&message) {
            let description = message.description.as_deref().unwrap_or("");
            match state.pulls.status(status, &message) {
                PullEnd::Heartbeat => {}
                PullEnd::Normal => debug!(%status, description, "pull ended"),
                PullEnd::Failed => {
                    warn!(%status, description, "pull ended with an error; reopening the consumer");
                    state.failed();
                }
            }
            return true;
        }
        state.last_message = Instant::now();
        let size = message.length.max(message.payload.len());
        state.largest = state.largest.max(size);
        let Taken { slot, mut held } = state.pulls.delivered(size);
        if held.bytes() < size {
            // Sent beyond what the pulls under way held (one the loop had
            // already given up): its bytes, if free.
            if let Some(more) = limits.budget.try_hold(size - held.bytes()) {
                held.merge(more);
            }
        }
        let message = jetstream::Message {
            message,
            context: self.js.clone(),
        };
        let delivery = Box::new(self.delivery(message));
        let admitted = Admitted {
            delivery,
            held,
            slot,
        };
        out.send(Admission::Admitted(admitted)).is_ok()
    }

    /// Every [`RECONNECT_CHECK`]: forgets the pulls sent on a connection
    /// that was re-established (the server may have lost them) and those
    /// whose end is overdue; sweeps when idle.
    async fn check(&self, state: &mut State, consuming: bool) {
        if self.connects() != state.connects {
            info!("NATS connection re-established; pulling again");
            state.failed();
            return;
        }
        state.pulls.give_up_late(tokio::time::Instant::now());
        if consuming
            && state.opened
            && state.last_message.elapsed() >= PULL_EXPIRES
            && state.last_sweep.elapsed() >= SWEEP_EVERY
        {
            self.sweep().await;
            state.last_sweep = Instant::now();
        }
    }
}

/// Waits until a pull could be sent: a slot and the bytes of the largest
/// accepted message free. Holds neither.
async fn room(limits: &Limits, least: usize) {
    if let Ok(slot) = limits.slots.acquire().await {
        drop(slot);
    }
    drop(limits.budget.hold_free(least).await);
}

/// Ends the inbox subscription; a failure only means the connection is
/// gone, which ends it as well.
async fn unsubscribe(mut sub: Subscriber) {
    if let Err(e) = sub.unsubscribe().await {
        debug!(error = %e, "pull inbox not unsubscribed");
    }
}

/// Waits [`RETRY_PAUSE`], or less if shutdown comes first (then noted in
/// `stopped_at`). Returns at once when already stopping.
async fn pause(
    shutdown: &mut Pin<&mut impl Future<Output = ()>>,
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
