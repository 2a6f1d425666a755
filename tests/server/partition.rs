//! A link that goes silent without closing (issue 40): the worker reaches
//! nats-server through the harness's fault proxy, which black-holes it.

use crate::common;

use common::fault_proxy::{Fault, FaultProxy};
use common::jetstream_support;
use common::messages::msgpack;
use common::worker_support::{PREFILL, client};
use common::{Etcd, Nats, Worker, free_port, http_send, poll_until_blocking};
use futures::StreamExt;
use serde_json::json;
use std::time::Duration;
use tokio::task::block_in_place;

/// `/readyz`'s status, or 0 when it does not answer.
fn readyz(metrics: &str) -> u16 {
    http_send(metrics, b"GET /readyz HTTP/1.1\r\n\r\n").map_or(0, |r| r.status)
}

/// The bounds are generous for a loaded machine; the test does not time
/// anything beyond them. With the client's own ping default (60 s, the
/// connection given up after three unanswered pings) the worker stayed
/// ready through the whole cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_worker_behind_a_silent_nats_link_turns_not_ready_then_recovers() {
    black_holed_then_healed("core").await;
}

/// As in core mode; the result after the heal is stored in the prefill
/// stream and taken by the durable consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jetstream_worker_behind_a_silent_nats_link_turns_not_ready_then_recovers() {
    black_holed_then_healed("jetstream").await;
}

/// A worker in `mode` that reaches nats-server through `proxy`, once
/// `/readyz` answers 200 (within 60 s: the start's own round trips cross
/// the proxy too); its metrics address.
fn spawn_ready(mode: &str, proxy: &FaultProxy, etcd: &Etcd) -> (Worker, String) {
    let (url, metrics) = (
        format!("nats://{}", proxy.addr()),
        format!("127.0.0.1:{}", free_port()),
    );
    let endpoint = etcd.endpoint();
    let args = [
        "run",
        "--mode",
        mode,
        "--nats-url",
        &url,
        "--etcd-endpoints",
        &endpoint,
        "--metrics-addr",
        &metrics,
    ];
    let worker = Worker::spawn(&args, &[("NO_COLOR", "1")]);
    let ready =
        block_in_place(|| poll_until_blocking(Duration::from_secs(60), || readyz(&metrics) == 200));
    assert!(ready, "the worker did not become ready:\n{}", worker.log());
    (worker, metrics)
}

async fn black_holed_then_healed(mode: &str) {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let test = client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    if mode == "jetstream" {
        jetstream_support::setup(&js, &jetstream_support::config(&nats)).await;
    }
    let proxy = FaultProxy::start(nats.addr());
    let (mut worker, metrics) = spawn_ready(mode, &proxy, &etcd);
    let pid = worker.pid();

    proxy.set(Fault::BlackHole);
    let noticed =
        block_in_place(|| poll_until_blocking(Duration::from_secs(30), || readyz(&metrics) == 503));
    assert!(noticed, "still ready 30 s into the cut:\n{}", worker.log());

    proxy.set(Fault::Pass);
    let back =
        block_in_place(|| poll_until_blocking(Duration::from_secs(60), || readyz(&metrics) == 200));
    assert!(back, "not ready 60 s after the heal:\n{}", worker.log());
    assert!(worker.is_running(), "the worker exited:\n{}", worker.log());
    assert_eq!(worker.pid(), pid, "the same process");

    // And it works again: a result through the healed link is answered.
    let mut replies = test.subscribe("_INBOX.partition.>").await.unwrap();
    test.flush().await.unwrap();
    let body = msgpack(&json!({
        "request_id": "p1",
        "reply_to": "_INBOX.partition.p1",
        "frames": [{"finish_reason": "eos"}],
    }));
    let answered = async {
        // Core mode is at most once: publish until the resubscribed worker
        // answers one. JetStream mode keeps the one it stored.
        loop {
            if mode == "jetstream" {
                let ack = js.publish(PREFILL, body.clone().into()).await.unwrap();
                ack.await.unwrap();
                return replies.next().await.unwrap();
            }
            test.publish(PREFILL, body.clone().into()).await.unwrap();
            let got = tokio::time::timeout(Duration::from_secs(1), replies.next()).await;
            if let Ok(Some(reply)) = got {
                return reply;
            }
        }
    };
    let reply = tokio::time::timeout(Duration::from_secs(60), answered)
        .await
        .unwrap_or_else(|_| panic!("no answer after the heal:\n{}", worker.log()));
    assert_eq!(reply.subject.as_str(), "_INBOX.partition.p1");
}

/// `/readyz` 200 in core mode means the server holds the worker's
/// subscriptions: over a slow link (each chunk held 300 ms, so a SUB
/// reaches the server well after the worker sent it), a single result and
/// an ID request, sent straight to the server right after the first 200,
/// are answered. Reported ready on sending its SUBs, the worker missed
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_worker_is_ready_once_the_server_holds_its_subscriptions() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let test = client(&nats.url()).await;
    let mut replies = test.subscribe("_INBOX.ready.>").await.unwrap();
    test.flush().await.unwrap();
    let proxy = FaultProxy::start(nats.addr());
    proxy.set(Fault::Latency(Duration::from_millis(300)));
    let (worker, _metrics) = spawn_ready("core", &proxy, &etcd);

    let ids = test.request("llm.handoff.ids", Vec::new().into()).await;
    assert!(
        ids.is_ok(),
        "the ID request sent once ready: {ids:?}\n{}",
        worker.log()
    );
    let body = msgpack(&json!({
        "request_id": "r1",
        "reply_to": "_INBOX.ready.r1",
        "frames": [{"finish_reason": "eos"}],
    }));
    test.publish(PREFILL, body.into()).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(30), replies.next()).await;
    let reply = reply.ok().flatten().unwrap_or_else(|| {
        panic!(
            "the result published once ready was lost:\n{}",
            worker.log()
        )
    });
    assert_eq!(reply.subject.as_str(), "_INBOX.ready.r1");
}
