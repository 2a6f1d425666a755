//! The shared confirmation of core publishes (durable mode's replies and dead
//! letters) against a real nats-server: every publish confirmed is at the
//! server, concurrent callers share probes without hanging, and a server
//! that is gone yields an error, never a hang.

use crate::common;

use common::Nats;
use futures::StreamExt;
use prefill_handoff::transport::jetstream::confirm::Confirmer;
use std::collections::BTreeSet;
use std::time::Duration;

/// Far longer than any round trip or async-nats' 10 s request timeout: only
/// a hang reaches it.
const HANG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_confirm_every_concurrent_publish_is_at_the_server_when_confirmed() {
    let nats = Nats::start();
    let observer = async_nats::connect(nats.url()).await.expect("connect");
    let mut seen = observer.subscribe("confirm.test").await.expect("subscribe");
    observer.flush().await.expect("flush");

    let client = async_nats::connect(nats.url()).await.expect("connect");
    let confirmer = Confirmer::new(client.clone());
    let total = 500u32;
    let tasks: Vec<_> = (0..total)
        .map(|i| {
            let (client, confirmer) = (client.clone(), confirmer.clone());
            tokio::spawn(async move {
                client
                    .publish("confirm.test", i.to_string().into())
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
    // Every confirmed publish reached the server, which routes each to the
    // observer: all of them arrive, none is missing.
    let mut got = BTreeSet::new();
    while got.len() < total as usize {
        let message = tokio::time::timeout(HANG, seen.next())
            .await
            .expect("every confirmed publish is delivered")
            .expect("subscription open");
        got.insert(String::from_utf8_lossy(&message.payload).to_string());
    }
    assert_eq!(got.len(), total as usize);
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
    let confirmed = tokio::time::timeout(HANG, async {
        loop {
            if confirmer.confirm().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(confirmed.is_ok(), "confirmations resume after a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_confirm_a_cancelled_prober_does_not_strand_the_others() {
    let mut nats = Nats::start();
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(30)))
        .connect(nats.url())
        .await
        .expect("connect");
    let confirmer = Confirmer::new(client.clone());
    // With the server gone, the first caller's probe stays out (up to the
    // 30 s request timeout); the second waits for it or for the next one.
    nats.kill();
    let prober = {
        let confirmer = confirmer.clone();
        tokio::spawn(async move { confirmer.confirm().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiter = {
        let confirmer = confirmer.clone();
        tokio::spawn(async move { confirmer.confirm().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Cancelling the prober ends its probe: the waiter is answered (by the
    // cancelled probe or by its own next one), it does not wait forever.
    prober.abort();
    nats.restart();
    let outcome = tokio::time::timeout(HANG, waiter)
        .await
        .expect("the waiter is not stranded")
        .expect("task");
    // Its own probe went out after the restart or failed: either is an
    // answer; what matters is that there is one.
    let _ = outcome;
}
