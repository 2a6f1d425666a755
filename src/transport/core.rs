//! Core NATS delivery (contract 7, `core`): a queue subscription on every
//! prefill subject, shared by all workers in the queue group. At most once: a
//! message published while no worker listens is lost, and so is one a worker
//! holds when it dies.

use super::{Attempt, Delivery, Limits, Settler, Source, TransportError};
use async_nats::{Client, Subscriber};
use futures::StreamExt;
use futures::stream::SelectAll;
use std::time::Instant;

/// The queue subscriptions, read through the intake (`core_intake.rs`).
pub(super) struct Subscriptions {
    client: Client,
    subscriptions: SelectAll<Subscriber>,
}

/// Subscribes to each subject in `queue_group`, and starts taking results
/// within `limits`' byte budget.
pub async fn subscribe(
    client: &Client,
    subjects: &[String],
    queue_group: &str,
    limits: &Limits,
) -> Result<Source, TransportError> {
    let subscriptions = Subscriptions::subscribe(client, subjects, queue_group).await?;
    let intake = super::core_intake::Intake::new(subscriptions, limits.budget.clone());
    Ok(Source::core(intake))
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
        let mut subscriptions = SelectAll::new();
        for subject in subjects {
            let subscriber = client
                .queue_subscribe(subject.clone(), queue_group.to_string())
                .await
                .map_err(|e| TransportError::Subscribe {
                    subject: subject.clone(),
                    queue_group: queue_group.to_string(),
                    reason: e.to_string(),
                })?;
            tracing::info!(%subject, %queue_group, "subscribed (core NATS queue group)");
            subscriptions.push(subscriber);
        }
        Ok(Subscriptions {
            client: client.clone(),
            subscriptions,
        })
    }

    /// The next message from any subscription; `None` when all are drained.
    /// Cancel-safe: each subscription is a channel receiver.
    pub(super) async fn next(&mut self) -> Option<Delivery> {
        let message = self.subscriptions.next().await?;
        Some(Delivery {
            subject: message.subject,
            payload: message.payload,
            headers: message.headers,
            reply: message.reply,
            received_at: Instant::now(),
            attempt: Attempt::ONLY,
            settler: Settler::AtMostOnce,
        })
    }

    /// Unsubscribes every subscription: the server routes new messages to
    /// the queue group's other members. Messages this worker has already
    /// received keep coming out of `next`, which then returns
    /// `None`.
    ///
    /// async-nats 0.51 drops a drained subscription one poll after sending
    /// the UNSUB, not when the server confirms it, and its `flush` does not
    /// wait for the server; messages still on their way would be lost. So a
    /// fence comes first: a message to this connection's own inbox, which the
    /// server queues behind everything it has already routed here. Once it is
    /// back, all of that is in the subscriptions' queues. What can still be
    /// lost is what the server routes here in the moment between the fence
    /// and the UNSUB (core NATS is at most once; JetStream mode loses nothing).
    pub(super) async fn drain(&mut self) {
        match fence(&self.client).await {
            Ok(()) => tracing::debug!("drain fence returned"),
            Err(e) => tracing::warn!(error = %e, "no drain fence; messages in transit may be lost"),
        }
        for subscriber in self.subscriptions.iter_mut() {
            if let Err(e) = subscriber.drain().await {
                tracing::warn!(error = %e, "could not drain a subscription; the connection is closing");
            }
        }
    }
}

/// Why the drain fence did not come back.
#[derive(Debug, thiserror::Error)]
enum FenceError {
    #[error("cannot subscribe to the fence inbox: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    #[error("cannot publish the fence: {0}")]
    Publish(#[from] async_nats::PublishError),
    #[error("the connection closed")]
    Closed,
    #[error("no answer within {FENCE_TIMEOUT:?}")]
    Timeout,
}

/// Sends a message to a fresh inbox of this connection and waits for it.
async fn fence(client: &Client) -> Result<(), FenceError> {
    let inbox = client.new_inbox();
    let mut subscriber = client.subscribe(inbox.clone()).await?;
    client.publish(inbox, bytes::Bytes::new()).await?;
    match tokio::time::timeout(FENCE_TIMEOUT, subscriber.next()).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(FenceError::Closed),
        Err(_) => Err(FenceError::Timeout),
    }
}

/// How long the drain fence may take; the shutdown timeout bounds it too.
const FENCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
