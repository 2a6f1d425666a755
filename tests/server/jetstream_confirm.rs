//! The shared confirmation of core publishes (durable mode's replies and dead
//! letters) against a real nats-server: every publish confirmed is at the
//! server, concurrent callers share probes without hanging, and a server
//! that is gone yields an error, never a hang.

use crate::common;

use bytes::Bytes;
use common::{Nats, poll_until};
use futures::{FutureExt, StreamExt};
use prefill_handoff::transport::jetstream::confirm::Confirmer;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::mpsc;

/// Far longer than any round trip or async-nats' 10 s request timeout: only
/// a hang reaches it.
const HANG: Duration = Duration::from_secs(60);

/// Big enough that the server needs a while to read every publish: a
/// confirmation that does not wait for the server returns long before
/// (500 x 64 KiB = 32 MiB on one connection).
const PAYLOAD: usize = 64 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_confirm_every_concurrent_publish_is_at_the_server_when_confirmed() {
    let nats = Nats::start();
    let observer = async_nats::connect(nats.url()).await.expect("connect");
    let mut seen = observer.subscribe("confirm.test").await.expect("subscribe");
    // The server has the subscription before the other connection publishes.
    common::worker_support::round_trip(&observer).await;

    let client = async_nats::connect(nats.url()).await.expect("connect");
    let confirmer = Confirmer::new(client.clone());
    let total = 500u32;
    let tasks: Vec<_> = (0..total)
        .map(|i| {
            let (client, confirmer) = (client.clone(), confirmer.clone());
            tokio::spawn(async move {
                let mut payload = vec![b' '; PAYLOAD];
                payload[..4].copy_from_slice(&i.to_be_bytes());
                client
                    .publish("confirm.test", payload.into())
                    .await
                    .expect("publish");
                confirmer.confirm().await
            })
        })
        .collect();
    for task in tasks {
        let outcome = tokio::time::timeout(HANG, task).await.expect("no hang");
        assert_eq!(outcome.expect("task"), Ok(()));
    }
    // Every confirmed publish was processed by the server, which queued it
    // to the observer then: after a round trip of the observer's own (the
    // server's answer comes after those messages on its connection) all of
    // them are already received, without waiting for more.
    round_trip(&observer).await;
    let mut got = BTreeSet::new();
    // `unconstrained`: tokio's cooperative budget would otherwise report
    // Pending after 128 receives, as if nothing more had arrived.
    while let Some(Some(message)) = tokio::task::unconstrained(seen.next()).now_or_never() {
        got.insert(message.payload[..4].to_vec());
    }
    assert_eq!(
        got.len(),
        total as usize,
        "confirmed publishes not yet at the server when confirmed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_confirm_without_a_server_fails_instead_of_hanging() {
    let mut nats = Nats::start();
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(2)))
        .connect(nats.url())
        .await
        .expect("connect");
    let confirmer = Confirmer::new(client.clone());
    assert_eq!(confirmer.confirm().await, Ok(()), "server up");

    nats.kill();
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let confirmer = confirmer.clone();
            tokio::spawn(async move { confirmer.confirm().await })
        })
        .collect();
    for waiter in waiters {
        let outcome = tokio::time::timeout(HANG, waiter)
            .await
            .expect("no hang")
            .expect("task");
        assert!(outcome.is_err(), "no server, no confirmation: {outcome:?}");
    }

    // Back again: confirmations succeed once the client has reconnected.
    nats.restart();
    let confirmed = poll_until(HANG, || async { confirmer.confirm().await.is_ok() }).await;
    assert!(confirmed, "confirmations resume after a restart");
}

/// Returns once the server has processed everything `client` sent before:
/// a request nobody listens to, answered "no responders" by the server.
/// (async-nats' `flush()` only writes; it does not wait for the server.)
async fn round_trip(client: &async_nats::Client) {
    let answer = client.request("confirm.nobody", Bytes::new()).await;
    assert!(
        answer.is_err_and(|e| e.kind() == async_nats::RequestErrorKind::NoResponders),
        "the server answers a request nobody listens to"
    );
}

/// A probe nobody answers: a subscriber on the probing client's inboxes
/// (prefix `_PROBE`, so not on its own) that stays silent, so the server sends
/// no "no responders" either. It hands each probe's reply subject to the
/// test, which answers when it chooses.
async fn silent_responder(nats: &Nats) -> (async_nats::Client, mpsc::UnboundedReceiver<String>) {
    let hole = async_nats::connect(nats.url()).await.expect("connect");
    // Probes go to `_PROBE.<id>`; replies to `_PROBE.<id>.<token>` do not match.
    let mut requests = hole.subscribe("_PROBE.*").await.expect("subscribe");
    // The subscription is at the server before any probe is sent.
    round_trip(&hole).await;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            if let Some(reply) = message.reply {
                let _ = tx.send(reply.to_string());
            }
        }
    });
    (hole, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_confirm_a_cancelled_prober_does_not_strand_the_others() {
    let nats = Nats::start();
    // Longer than HANG: an unanswered probe never ends by itself here, so
    // only the cancellation can free the waiter.
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(10 * HANG))
        .custom_inbox_prefix("_PROBE")
        .connect(nats.url())
        .await
        .expect("connect");
    let (hole, mut probes) = silent_responder(&nats).await;
    let confirmer = Confirmer::new(client.clone());

    // The first caller sends probe 1, which nobody answers.
    let prober = {
        let confirmer = confirmer.clone();
        tokio::spawn(async move { confirmer.confirm().await })
    };
    tokio::time::timeout(HANG, probes.recv())
        .await
        .expect("probe 1 is sent")
        .expect("responder running");

    // The second caller arrives while probe 1 is out: it waits (polled once,
    // so it is registered before the cancellation, not after).
    let mut waiter = Box::pin(confirmer.confirm());
    assert!(
        futures::poll!(&mut waiter).is_pending(),
        "no answer while probe 1 is out"
    );

    // Cancel the prober, and see that it was cancelled, not finished.
    prober.abort();
    let joined = tokio::time::timeout(HANG, prober)
        .await
        .expect("abort ends it");
    assert!(
        joined.is_err_and(|e| e.is_cancelled()),
        "the prober was cancelled mid-probe"
    );

    // The waiter is not stranded: it sends probe 2, which is answered.
    let answer = async {
        let reply = probes.recv().await.expect("responder running");
        hole.publish(reply, Bytes::new()).await.expect("reply");
        hole.flush().await.expect("flush");
    };
    let (outcome, ()) = tokio::time::timeout(HANG, async { tokio::join!(&mut waiter, answer) })
        .await
        .expect("the waiter is not stranded by the cancelled probe");
    assert_eq!(outcome, Ok(()));
}
