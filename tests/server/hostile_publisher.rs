//! A hostile publisher on the shared bus. A raw `HPUB` whose header block
//! the client cannot parse (here a line feed inside a value, which splits
//! it into a line without a colon) is dead-lettered once as `malformed`,
//! every worker stays up and ready, and normal results sent afterwards all
//! get their one output. The stock client drops its connection on such a
//! block; the patched one delivers it marked (vendor/patches/0002).
//!
//! Every test here also runs against the second nats-server build
//! (scripts/test.sh re-runs this binary with `HANDOFF_TEST_NATS_SERVER`).

use crate::common;
use crate::common::jetstream_support;
use crate::common::messages::{self, decode_output, header, msgpack};
use crate::common::worker_support;

use common::{Etcd, Nats, Worker, http_get};
use serde_json::json;
use std::time::Duration;
use tokio::task::block_in_place;

/// A line feed inside a header value: the value's second half is a line
/// without a colon.
const HOSTILE_BLOCK: &[u8] = b"NATS/1.0\r\nX-Evil: a\nb\r\n\r\n";
/// Why the dead letter says it was dead-lettered.
const REASON: &str =
    "the message's NATS header block could not be parsed: a header line has no colon";
const NORMAL: usize = 1_000;

/// `prefill-handoff run` in `mode`, ready, with its metrics address; a short
/// ack wait and nak delay so redeliveries come quickly.
fn spawn_ready(nats: &Nats, etcd: &Etcd, mode: &str) -> (Worker, String) {
    let settings = ["jetstream.ack_wait_secs=2", "jetstream.nak_delay_ms=100"];
    block_in_place(|| Worker::run_ready(nats, etcd, mode, &settings, &[]))
}

/// Waits until the workers' output counters account for every delivery
/// ([`jetstream_support::wait_every_delivery_answered`]).
async fn every_delivery_answered(
    js: &async_nats::jetstream::Context,
    workers: &[(Worker, String)],
) {
    let answered = || {
        block_in_place(|| {
            workers
                .iter()
                .map(|(_, metrics)| worker_support::outputs_counted(metrics))
                .sum::<u64>()
        })
    };
    let settled =
        jetstream_support::wait_every_delivery_answered(js, Duration::from_secs(30), answered)
            .await;
    assert!(settled, "{}", jetstream_support::queue_state(js).await);
}

/// Every worker is still running and `/readyz` answers 200.
fn assert_up_and_ready(workers: &mut [(Worker, String)]) {
    for (worker, metrics) in workers.iter_mut() {
        assert!(worker.is_running(), "a worker exited:\n{}", worker.log());
        let readyz = block_in_place(|| http_get(metrics.as_str(), "/readyz"));
        assert_eq!(readyz.status, 200, "{}\n{}", readyz.body, worker.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn core_hostile_header_block_is_dead_lettered_once_and_workers_keep_working() {
    use worker_support::{Collector, DEAD, PREFILL, outputs_counted};
    let nats = Nats::start();
    let etcd = Etcd::start();
    let mut workers = vec![
        spawn_ready(&nats, &etcd, "core"),
        spawn_ready(&nats, &etcd, "core"),
    ];
    let test = worker_support::client(&nats.url()).await;
    let collector = Collector::start(&test).await;

    block_in_place(|| {
        nats.raw_hpub(
            PREFILL,
            HOSTILE_BLOCK,
            &msgpack(&messages::terminal("hostile")),
        )
    });
    let metrics: Vec<String> = workers.iter().map(|(_, m)| m.clone()).collect();
    // Settled: the workers' counters add up to `n` results answered.
    let answered = |n: usize| {
        let metrics = &metrics;
        move || async move {
            block_in_place(|| metrics.iter().map(|m| outputs_counted(m)).sum::<u64>()) >= n as u64
        }
    };
    let outputs = collector
        .wait_outputs(1, Duration::from_secs(20), answered(1))
        .await;
    let dead: Vec<_> = outputs
        .iter()
        .filter(|m| m.subject.as_str() == DEAD)
        .collect();
    assert_eq!(dead.len(), 1, "one dead letter: {outputs:?}");
    let headers = dead[0].headers.as_ref();
    assert_eq!(header(headers, "Handoff-Error-Code"), Some("malformed"));
    let why = header(headers, "Handoff-Error").unwrap_or_default();
    assert!(why.starts_with(REASON), "{why:?}");
    assert_eq!(
        &dead[0].payload[..],
        &msgpack(&messages::terminal("hostile"))[..]
    );
    assert_up_and_ready(&mut workers);

    for i in 0..NORMAL {
        let id = format!("n{i}");
        test.publish(PREFILL, msgpack(&messages::terminal(&id)).into())
            .await
            .expect("publish");
    }
    test.flush().await.expect("flush");
    let outputs = collector
        .wait_outputs(NORMAL + 1, Duration::from_secs(60), answered(NORMAL + 1))
        .await;
    let mut replies: Vec<&str> = outputs
        .iter()
        .filter_map(|m| m.subject.as_str().strip_prefix("llm.replies."))
        .collect();
    replies.sort_unstable();
    let mut expected: Vec<String> = (0..NORMAL).map(|i| format!("n{i}")).collect();
    expected.sort_unstable();
    assert_eq!(replies, expected, "one reply per normal result");
    let dead = outputs
        .iter()
        .filter(|m| m.subject.as_str() == DEAD)
        .count();
    assert_eq!(dead, 1, "still one dead letter");
    assert_eq!(outputs.len(), NORMAL + 1, "nothing else was published");
    assert_up_and_ready(&mut workers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_hostile_header_block_is_dead_lettered_once_and_three_workers_keep_working() {
    use jetstream_support::{
        Collector, DEAD, Expect, PREFILL, all_outputs, capture_outputs, check_outputs, config,
        publish_all, queue_state, setup, wait_drained,
    };
    let nats = Nats::start();
    let etcd = Etcd::start();
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config(&nats)).await;
    capture_outputs(&js).await;
    let collector = Collector::start(&client).await;
    let mut workers = vec![
        spawn_ready(&nats, &etcd, "jetstream"),
        spawn_ready(&nats, &etcd, "jetstream"),
        spawn_ready(&nats, &etcd, "jetstream"),
    ];

    block_in_place(|| {
        nats.raw_hpub(
            PREFILL,
            HOSTILE_BLOCK,
            &msgpack(&messages::terminal("hostile")),
        )
    });
    assert!(
        collector.wait_for(1, Duration::from_secs(30)).await,
        "no dead letter; {}",
        queue_state(&js).await
    );
    assert!(
        wait_drained(&js, Duration::from_secs(30)).await,
        "the hostile message was not terminated: {}",
        queue_state(&js).await
    );
    let seen = collector.all();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (seen[0].kind, seen[0].subject.as_str()),
        (Expect::Dead, DEAD)
    );
    let headers = seen[0].headers.as_ref().expect("dead-letter headers");
    let code = headers.get("Handoff-Error-Code").map(|v| v.as_str());
    assert_eq!(code, Some("malformed"));
    let why = headers.get("Handoff-Error").map(|v| v.as_str());
    assert!(why.unwrap_or_default().starts_with(REASON), "{why:?}");
    assert_up_and_ready(&mut workers);

    let inputs: Vec<_> = (0..NORMAL)
        .map(|i| jetstream_support::Input::terminal(&format!("n{i}")))
        .collect();
    publish_all(&js, &inputs).await;
    assert!(
        wait_drained(&js, Duration::from_secs(120)).await,
        "work queue not drained: {}",
        queue_state(&js).await
    );
    every_delivery_answered(&js, &workers).await;
    let mut expected = inputs.clone();
    expected.push(jetstream_support::Input {
        request_id: "hostile".into(),
        payload: msgpack(&messages::terminal("hostile")),
        json: false,
        expect: Expect::Dead,
    });
    let outputs = all_outputs(&js).await;
    let duplicates = check_outputs(&expected, &outputs);
    assert!(
        duplicates.is_empty(),
        "more than one output: {duplicates:?}"
    );
    assert_eq!(outputs.len(), NORMAL + 1);
    assert_up_and_ready(&mut workers);
}

/// A publisher can also put a status in the version line (`NATS/1.0 408`),
/// which nats-server forwards verbatim. A pull consumer took such a stored
/// message for the server's own status message: a 408 or 404 ended the pull,
/// a 409 failed it, and the message was never handled, on every redelivery.
/// The patched client reads a message delivered with an ack subject as a
/// message (docs/vendor-async-nats.md): each gets its one reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_forged_status_lines_are_handled_as_messages() {
    use jetstream_support::{
        Collector, Expect, PREFILL, all_outputs, capture_outputs, check_outputs, config,
        queue_state, setup, wait_drained,
    };
    let nats = Nats::start();
    let etcd = Etcd::start();
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config(&nats)).await;
    capture_outputs(&js).await;
    let collector = Collector::start(&client).await;
    let mut workers = vec![
        spawn_ready(&nats, &etcd, "jetstream"),
        spawn_ready(&nats, &etcd, "jetstream"),
    ];
    let forged: [&[u8]; 5] = [
        b"NATS/1.0 408 Request Timeout\r\n\r\n",
        b"NATS/1.0 404 No Messages\r\n\r\n",
        b"NATS/1.0 409 Consumer Deleted\r\n\r\n",
        b"NATS/1.0 100 Idle Heartbeat\r\n\r\n",
        b"NATS/1.0 503\r\n\r\n",
    ];
    let mut inputs = Vec::new();
    for (i, block) in forged.iter().enumerate() {
        let request_id = format!("forged-{i}");
        block_in_place(|| {
            nats.raw_hpub(PREFILL, block, &msgpack(&messages::terminal(&request_id)))
        });
        inputs.push(jetstream_support::Input {
            payload: msgpack(&messages::terminal(&request_id)),
            request_id,
            json: false,
            expect: Expect::Reply,
        });
    }
    assert!(
        collector
            .wait_for(forged.len(), Duration::from_secs(30))
            .await,
        "replies: {:?}; {}",
        collector.all(),
        queue_state(&js).await
    );
    assert!(
        wait_drained(&js, Duration::from_secs(30)).await,
        "{}",
        queue_state(&js).await
    );
    every_delivery_answered(&js, &workers).await;
    let outputs = all_outputs(&js).await;
    let duplicates = check_outputs(&inputs, &outputs);
    assert!(
        duplicates.is_empty(),
        "more than one output: {duplicates:?}"
    );
    assert_up_and_ready(&mut workers);
}

/// The ID mint service reads the same connection: a request whose header
/// block the client could not parse is refused `malformed` (the pipeline
/// dead-letters such a result), whatever its body asks for, and no ID is
/// minted for it; a publisher forging the client's marker gets the same.
/// The service keeps answering well-formed requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn id_requests_with_an_unparsable_header_block_are_refused_malformed() {
    use futures::StreamExt;
    const IDS: &str = "llm.handoff.ids";
    let nats = Nats::start();
    let etcd = Etcd::start();
    let mut workers = vec![spawn_ready(&nats, &etcd, "core")];
    let test = worker_support::client(&nats.url()).await;
    let mut answers = test.subscribe("_INBOX.hostile.>").await.expect("subscribe");
    test.flush().await.expect("flush");

    // (header block, what the refusal names)
    let cases: [(&[u8], &str); 2] = [
        (HOSTILE_BLOCK, "a header line has no colon"),
        (
            b"NATS/1.0\r\nAsync-Nats-Header-Block-Error: fine\r\n\r\n",
            "is reserved by the client",
        ),
    ];
    let body = msgpack(&json!({"count": 5}));
    for (i, (block, why)) in cases.iter().enumerate() {
        let reply = format!("_INBOX.hostile.{i}");
        block_in_place(|| nats.raw_hpub_with_reply(IDS, Some(&reply), block, &body));
        let answer = tokio::time::timeout(Duration::from_secs(10), answers.next())
            .await
            .expect("the ID service answers")
            .expect("an answer");
        assert_eq!(answer.subject.as_str(), reply);
        let value = decode_output(&answer);
        assert_eq!(value["kind"], "error", "{value}");
        assert_eq!(value["error"]["code"], "malformed", "{value}");
        assert_eq!(value["request_id"], serde_json::Value::Null);
        assert!(value.get("ids").is_none(), "{value}");
        let message = value["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("the request's NATS header block could not be parsed: ")
                && message.contains(why),
            "{message:?}"
        );
    }

    let answer = test
        .request(IDS, msgpack(&json!({"count": 2})).into())
        .await
        .expect("a well-formed request is answered");
    let value = decode_output(&answer);
    assert_eq!(value["ids"].as_array().map(Vec::len), Some(2), "{value}");

    let metrics = block_in_place(|| http_get(workers[0].1.as_str(), "/metrics"));
    let samples = common::prometheus_samples(&metrics.body);
    let sample = |series: &str| samples.get(series).copied().unwrap_or(-1.0);
    assert_eq!(
        sample("handoff_id_requests_total{result=\"malformed\"}"),
        cases.len() as f64
    );
    assert_eq!(sample("handoff_id_requests_total{result=\"ok\"}"), 1.0);
    assert_eq!(
        sample("handoff_ids_minted_total{source=\"id_service\"}"),
        2.0,
        "only the well-formed request minted"
    );
    assert_up_and_ready(&mut workers);
}
