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

use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;
use std::time::Duration;

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
    let subject = client.new_inbox();
    // Dropped on return, which unsubscribes.
    let mut echo = client.subscribe(subject.clone()).await?;
    client.publish(subject, Bytes::new()).await?;
    let echoed = match client.timeout() {
        Some(limit) => tokio::time::timeout(limit, echo.next())
            .await
            .map_err(|_| RoundTripError::TimedOut(limit))?,
        None => echo.next().await,
    };
    echoed.map(|_| ()).ok_or(RoundTripError::Closed)
}
