//! Knowing that the server has processed what a connection sent.
//!
//! async-nats's `flush` only writes the client's buffer to the socket. A
//! message the connection publishes to a subject only it subscribes to
//! comes back after the server has processed everything the connection sent
//! before it (the server reads each connection in order): the PING/PONG
//! guarantee other NATS clients call flush. Subscriptions made before it
//! are then held by the server, publishes made before it routed.
//!
//! Not a request answered "no responders": the server sends that only
//! where nobody at all listens, and a subscriber on `>` (a `nats sub '>'`
//! while debugging, a tap) listens on every inbox too, so the request would
//! wait for its timeout instead. The echo needs the connection's echo, on by
//! default (`no_echo` unset).

use async_nats::{Client, Subscriber};
use bytes::Bytes;
use futures::StreamExt;
use std::time::Duration;
use tokio::time::Instant;

/// Why a round trip did not complete.
#[derive(Debug, thiserror::Error)]
pub enum RoundTripError {
    #[error("cannot subscribe for the round trip: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    #[error("cannot publish the round trip's message: {0}")]
    Publish(#[from] async_nats::PublishError),
    #[error("the server did not echo the round trip's message within {0:?}")]
    TimedOut(Duration),
    #[error("the connection closed before the server echoed the round trip's message")]
    Closed,
}

/// Returns once the server has processed everything `client` sent before
/// the call. Bounded by the client's request timeout (`None`: unbounded).
pub async fn round_trip(client: &Client) -> Result<(), RoundTripError> {
    Echo::new(client).await?.round_trip().await
}

/// Subjects only this connection subscribes to, for repeated round trips
/// at the cost of one publish each: an empty message to `<inbox>.<n>`
/// (the client's inbox prefix, which a worker under NATS permissions may
/// already use), the `n`th round trip's. Its subscription ends when it is
/// dropped.
pub struct Echo {
    client: Client,
    inbox: String,
    subscriber: Subscriber,
    /// Round trips started; an echo left over from one abandoned midway
    /// (its caller cancelled) has a lower number, and is passed over.
    sent: u64,
}

impl Echo {
    pub async fn new(client: &Client) -> Result<Echo, RoundTripError> {
        let inbox = client.new_inbox();
        let subscriber = client.subscribe(format!("{inbox}.*")).await?;
        Ok(Echo {
            client: client.clone(),
            inbox,
            subscriber,
            sent: 0,
        })
    }

    /// Returns once the server has processed everything the connection
    /// sent before the call. Bounded by the client's request timeout.
    pub async fn round_trip(&mut self) -> Result<(), RoundTripError> {
        self.sent += 1;
        let subject = format!("{}.{}", self.inbox, self.sent);
        self.client.publish(subject.clone(), Bytes::new()).await?;
        let deadline = self
            .client
            .timeout()
            .map(|limit| (Instant::now() + limit, limit));
        loop {
            let next = self.subscriber.next();
            let echoed = match deadline {
                Some((at, limit)) => tokio::time::timeout_at(at, next)
                    .await
                    .map_err(|_| RoundTripError::TimedOut(limit))?,
                None => next.await,
            };
            match echoed {
                Some(message) if message.subject.as_str() == subject => return Ok(()),
                Some(_) => continue,
                None => return Err(RoundTripError::Closed),
            }
        }
    }
}
