//! Core NATS delivery (contract 7, `core`): a queue subscription on every
//! prefill subject, shared by all workers in the queue group. At most once: a
//! message published while no worker listens is lost, and so is one a worker
//! holds when it dies.

pub(super) mod intake;
mod outbox;
mod sink;

pub use outbox::Outbox;
pub use sink::CoreSink;

use crate::transport::{Attempt, Delivery, Limits, Settler, TransportError, round_trip};
use async_nats::{Client, Subscriber};
use futures::Stream;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;

/// The queue subscriptions, read through the intake (`intake.rs`).
pub(super) struct Subscriptions {
    client: Client,
    /// Polled in turn, from `next_first` on; one that ends is removed. A
    /// plain list, not `SelectAll`, which re-queues a future per message
    /// (`docs/performance.md`), for what is nearly always one subject.
    subscriptions: Vec<Subscriber>,
    next_first: usize,
}

/// Subscribes to each subject in `queue_group`, and starts taking results
/// within `limits`' byte budget: the intake a [`crate::transport::Source`]
/// reads in place.
pub(super) async fn subscribe(
    client: &Client,
    subjects: &[String],
    queue_group: &str,
    limits: &Limits,
) -> Result<intake::Intake, TransportError> {
    let subscriptions = Subscriptions::subscribe(client, subjects, queue_group).await?;
    Ok(intake::Intake::new(subscriptions, limits.budget.clone()))
}

impl Subscriptions {
    async fn subscribe(
        client: &Client,
        subjects: &[String],
        queue_group: &str,
    ) -> Result<Subscriptions, TransportError> {
        if subjects.is_empty() {
            return Err(TransportError::NoSubjects);
        }
        let mut subscriptions = Vec::with_capacity(subjects.len());
        for subject in subjects {
            let subscriber = client
                .queue_subscribe(subject.clone(), queue_group.to_string())
                .await
                .map_err(|source| TransportError::Subscribe {
                    subject: subject.clone(),
                    queue_group: queue_group.to_string(),
                    source,
                })?;
            tracing::info!(%subject, %queue_group, "subscribed (core NATS queue group)");
            subscriptions.push(subscriber);
        }
        // The client sends SUB without waiting for the server: a worker
        // reported consuming (`/readyz`) before the server holds the
        // subscriptions would miss results published meanwhile.
        round_trip(client).await.map_err(TransportError::Confirm)?;
        Ok(Subscriptions {
            client: client.clone(),
            subscriptions,
            next_first: 0,
        })
    }

    /// The next message from any subscription; `None` when all are drained.
    /// Cancel-safe: each subscription is a channel receiver.
    pub(super) async fn next(&mut self) -> Option<Box<Delivery>> {
        let message = std::future::poll_fn(|cx| self.poll_message(cx)).await?;
        Some(Box::new(Delivery {
            subject: message.subject,
            payload: message.payload,
            headers: message.headers,
            reply: message.reply,
            received_at: Instant::now(),
            attempt: Attempt::ONLY,
            settler: Settler::AtMostOnce,
        }))
    }

    /// A message from the first subscription that has one, starting after
    /// the one that gave the last (so a busy subject cannot starve another).
    fn poll_message(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<async_nats::Message>> {
        let mut i = 0;
        while i < self.subscriptions.len() {
            let at = (self.next_first + i) % self.subscriptions.len();
            match Pin::new(&mut self.subscriptions[at]).poll_next(cx) {
                Poll::Ready(Some(message)) => {
                    self.next_first = at + 1;
                    return Poll::Ready(Some(message));
                }
                Poll::Ready(None) => {
                    // Ended (drained or closed): the rest move up one place.
                    self.subscriptions.remove(at);
                    self.next_first = at;
                    i = 0;
                }
                Poll::Pending => i += 1,
            }
        }
        if self.subscriptions.is_empty() {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }

    /// Unsubscribes every subscription: the server routes new messages to
    /// the queue group's other members. Messages this worker has already
    /// received keep coming out of `next`, which then returns
    /// `None`.
    ///
    /// async-nats drops a drained subscription one poll after sending
    /// the UNSUB, not when the server confirms it, and its `flush` does not
    /// wait for the server; messages still on their way would be lost. So a
    /// fence comes first: a [`round_trip`], whose message the server queues
    /// behind everything it has already routed here. Once it is
    /// back, all of that is in the subscriptions' queues. What can still be
    /// lost is what the server routes here in the moment between the fence
    /// and the UNSUB (core NATS is at most once; JetStream mode loses nothing).
    pub(super) async fn drain(&mut self) {
        match tokio::time::timeout(FENCE_TIMEOUT, round_trip(&self.client)).await {
            Ok(Ok(())) => tracing::debug!("drain fence returned"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "no drain fence; messages in transit may be lost");
            }
            Err(_) => tracing::warn!(
                timeout = ?FENCE_TIMEOUT,
                "no drain fence in time; messages in transit may be lost"
            ),
        }
        for subscriber in self.subscriptions.iter_mut() {
            if let Err(e) = subscriber.drain().await {
                tracing::warn!(error = %e, "could not drain a subscription; the connection is closing");
            }
        }
    }
}

/// How long the drain fence may take; the shutdown timeout bounds it too.
const FENCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
