//! Core NATS delivery (contract 7, `core`): a queue subscription on every
//! prefill subject, shared by all workers in the queue group. At most once: a
//! message published while no worker listens is lost, and so is one a worker
//! holds when it dies.

use super::{Ack, Incoming, TransportError};
use async_nats::{Client, Subscriber};
use futures::StreamExt;
use futures::stream::SelectAll;
use std::time::Instant;

pub struct CoreInbound {
    subscriptions: SelectAll<Subscriber>,
}

impl CoreInbound {
    /// Subscribes to each subject in `queue_group`.
    pub async fn subscribe(
        client: &Client,
        subjects: &[String],
        queue_group: &str,
    ) -> Result<CoreInbound, TransportError> {
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
        Ok(CoreInbound { subscriptions })
    }

    /// The next message from any subscription; `None` when all are drained.
    /// Cancel-safe: each subscription is a channel receiver.
    pub async fn next(&mut self) -> Option<Incoming> {
        let message = self.subscriptions.next().await?;
        Some(Incoming {
            subject: message.subject,
            payload: message.payload,
            headers: message.headers,
            nats_reply: message.reply,
            received_at: Instant::now(),
            ack: Ack::Core,
        })
    }

    /// Unsubscribes every subscription. The server stops routing new messages
    /// to this worker (the queue group's other members get them); messages
    /// already sent to it keep coming out of [`CoreInbound::next`] until the
    /// server confirms the unsubscribe, then `next` returns `None`.
    pub async fn drain(&mut self) {
        for subscriber in self.subscriptions.iter_mut() {
            if let Err(e) = subscriber.drain().await {
                tracing::warn!(error = %e, "could not drain a subscription; the connection is closing");
            }
        }
    }
}
