//! The shared confirmation of core publishes (durable mode's replies and dead
//! letters) against a real nats-server: every publish confirmed is at the
//! server, concurrent callers share probes without hanging, and a server
//! that is gone yields an error, never a hang.

use crate::common;

use common::fault_proxy::{Fault, FaultProxy};
use common::worker_support::round_trip;
use common::{Nats, poll_until};
use futures::{FutureExt, StreamExt};
use prefill_handoff::transport::jetstream::confirm::Confirmer;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

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
    round_trip(&observer).await;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_confirm_a_cancelled_prober_does_not_strand_the_others() {
    let nats = Nats::start();
    // The prober's link, black-holed while probe 1 is out: its echo stays
    // away until the test heals the link.
    let proxy = FaultProxy::start(nats.addr());
    // Longer than HANG: an unanswered probe never ends by itself here, so
    // only the cancellation can free the waiter.
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(10 * HANG))
        .connect(format!("nats://{}", proxy.addr()))
        .await
        .expect("connect");
    let confirmer = Confirmer::new(client.clone());
    assert_eq!(confirmer.confirm().await, Ok(()), "the link passes");

    // The first caller sends probe 1, which the link holds.
    proxy.set(Fault::BlackHole);
    let sent = client.statistics().out_messages.load(Ordering::Relaxed);
    let prober = {
        let confirmer = confirmer.clone();
        tokio::spawn(async move { confirmer.confirm().await })
    };
    let probe_sent = poll_until(HANG, || async {
        client.statistics().out_messages.load(Ordering::Relaxed) > sent
    })
    .await;
    assert!(probe_sent, "probe 1 is sent");

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

    // The waiter is not stranded: it sends probe 2, answered once the link
    // passes again.
    proxy.set(Fault::Pass);
    let outcome = tokio::time::timeout(HANG, &mut waiter)
        .await
        .expect("the waiter is not stranded by the cancelled probe");
    assert_eq!(outcome, Ok(()));
}
