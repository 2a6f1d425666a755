//! The core relay as a user of async-nats would write it from its README:
//! `async_nats::connect` with the default options, a queue subscription,
//! and `publish` of each message's payload to the GEN subject given as a
//! `String`, on tokio's default runtime (`examples/user_relay.rs`). The
//! second anchor of the benchmark (`scripts/bench.sh`, `user-relay`): the
//! worker's ratios against it say what the worker costs over the plainest
//! program that moves the same bytes, where [`crate::relay::CoreRelay`] is
//! tuned as the worker is (its subscription buffer, its subject built once).
//!
//! It builds against the workspace's async-nats: the published 0.52.0 with
//! the small patches of `vendor/patches/`, none of which is on the publish
//! path (the one on the read path adds a counter per message read).

use futures::StreamExt;

/// Relays `from` (in queue group `queue`) to `to` until the subscription
/// ends. Returns how many messages it relayed.
pub async fn run(
    client: async_nats::Client,
    from: String,
    queue: String,
    to: String,
) -> Result<u64, async_nats::Error> {
    let mut subscriber = client.queue_subscribe(from, queue).await?;
    client.flush().await?;
    let mut relayed = 0;
    while let Some(message) = subscriber.next().await {
        client.publish(to.clone(), message.payload).await?;
        relayed += 1;
    }
    Ok(relayed)
}
