//! The NATS client's bound in bytes on what its subscriptions hold
//! (`nats.subscription_bytes`, the vendored client's `subscription_bytes`),
//! against a real nats-server: at the bound the client stops reading, what
//! follows waits in the server, and nothing is lost or reordered.

use crate::common;

use async_nats::{Client, ConnectOptions, Subscriber};
use common::{Nats, within};
use futures::StreamExt as _;
use std::sync::atomic::Ordering;
use std::time::Duration;

const SUBJECT: &str = "bound.test";
const MESSAGES: usize = 64;
const SIZE: usize = 32 * 1024;
/// Eight messages' worth.
const BOUND: usize = 8 * SIZE;

/// A client whose subscriptions hold at most [`BOUND`] bytes together.
async fn bounded(nats: &Nats) -> Client {
    ConnectOptions::new()
        .subscription_bytes(BOUND)
        .connect(nats.url())
        .await
        .expect("connect")
}

/// Message `i`: [`SIZE`] bytes, its index in the first eight.
fn payload(i: usize) -> bytes::Bytes {
    let mut payload = vec![0u8; SIZE];
    payload[..8].copy_from_slice(&(i as u64).to_le_bytes());
    payload.into()
}

/// The index [`payload`] wrote.
fn index(payload: &[u8]) -> u64 {
    u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"))
}

fn read(client: &Client) -> u64 {
    client.statistics().in_messages.load(Ordering::Relaxed)
}

async fn publish_all(nats: &Nats, subject: &str, count: usize) {
    let publisher = async_nats::connect(nats.url()).await.expect("connect");
    for i in 0..count {
        publisher
            .publish(subject.to_string(), payload(i))
            .await
            .expect("publish");
    }
    publisher.flush().await.expect("flush");
}

async fn subscribed(client: &Client, subject: &str) -> Subscriber {
    let subscriber = client
        .subscribe(subject.to_string())
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    subscriber
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_stops_reading_at_its_bound_and_loses_nothing() {
    let nats = Nats::start();
    let bounded = bounded(&nats).await;
    // The same subscription on a client without the bound: it reads all.
    let unbounded = async_nats::connect(nats.url()).await.expect("connect");
    let mut held = subscribed(&bounded, SUBJECT).await;
    let _control = subscribed(&unbounded, SUBJECT).await;

    publish_all(&nats, SUBJECT, MESSAGES).await;
    assert!(
        within(Duration::from_secs(10), || read(&unbounded)
            == MESSAGES as u64)
        .await,
        "the unbounded client read {} of {MESSAGES}",
        read(&unbounded)
    );
    // The server sent both the same messages; the bounded client took only
    // its bound's worth off the socket (each message counts its payload and
    // subject), the rest waits in the server.
    let taken = read(&bounded);
    assert!(
        (1..=(BOUND / SIZE) as u64).contains(&taken),
        "the bounded client read {taken} messages of {SIZE} bytes with a bound of {BOUND}"
    );

    // Taking messages out makes room: all of them arrive, once, in order.
    for i in 0..MESSAGES {
        let message = tokio::time::timeout(Duration::from_secs(10), held.next())
            .await
            .unwrap_or_else(|_| panic!("message {i} never came"))
            .expect("subscription open");
        assert_eq!(index(&message.payload), i as u64);
    }
    assert_eq!(read(&bounded), MESSAGES as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_subscription_gives_its_bytes_back() {
    let nats = Nats::start();
    let client = bounded(&nats).await;
    // Fills the bound and is never read.
    let full = subscribed(&client, "bound.full").await;
    publish_all(&nats, "bound.full", 2 * BOUND / SIZE).await;
    assert!(
        within(Duration::from_secs(10), || read(&client)
            >= (BOUND / SIZE) as u64)
        .await,
        "the client read {} messages",
        read(&client)
    );
    // Dropped with its messages unread: they leave the bytes held, so the
    // client reads again (without that, it would stop for good).
    drop(full);
    let mut other = subscribed(&client, "bound.other").await;
    publish_all(&nats, "bound.other", 1).await;
    let message = tokio::time::timeout(Duration::from_secs(10), other.next())
        .await
        .expect("the client reads again once the full subscription is dropped")
        .expect("subscription open");
    assert_eq!(message.payload.len(), SIZE);
}

/// The JetStream consumers of the vendored client read a subscriber's
/// buffer themselves; their messages must leave the bytes held too. (They
/// did not at first: reading stopped for good after the bound's worth, and
/// the worker's JetStream mode stalled in the bench.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_pulls_through_a_bounded_client_give_their_bytes_back() {
    use async_nats::jetstream::{self, consumer::pull, stream};
    let nats = Nats::start();
    let client = bounded(&nats).await;
    let js = jetstream::new(client.clone());
    let stream = js
        .create_stream(stream::Config {
            name: "BOUND".into(),
            subjects: vec!["bound.js".into()],
            ..Default::default()
        })
        .await
        .expect("stream");
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("bound".into()),
            ..Default::default()
        })
        .await
        .expect("consumer");
    for i in 0..MESSAGES {
        js.publish("bound.js", payload(i))
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    // Eight times the bound in batches of four: each batch's messages must
    // leave the count for the next batch to be read at all. (Without that,
    // the client stops reading and everything waits on it, acks and pulls
    // included: the whole loop is bounded in time.)
    let pulled = tokio::time::timeout(Duration::from_secs(60), pull_all(&consumer)).await;
    assert!(
        pulled.is_ok(),
        "the pulls stopped: the client no longer reads"
    );
}

async fn pull_all(consumer: &async_nats::jetstream::consumer::PullConsumer) {
    let mut next = 0u64;
    while next < MESSAGES as u64 {
        let mut batch = consumer
            .batch()
            .max_messages(4)
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .expect("pull");
        while let Some(message) = tokio::time::timeout(Duration::from_secs(10), batch.next())
            .await
            .unwrap_or_else(|_| panic!("message {next} never came"))
        {
            let message = message.expect("a stored message");
            assert_eq!(index(&message.payload), next);
            message.ack().await.expect("ack");
            next += 1;
        }
    }
}
