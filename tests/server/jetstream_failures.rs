//! The durable mode when things go wrong, at library level (workers run in
//! the test process): a worker dies mid-run, nats-server restarts, poison
//! input, no identity to mint with, the GEN stream missing.

use crate::common;
use crate::common::jetstream_support;

use async_nats::jetstream;
use common::Nats;
use jetstream_support::*;
use prefill_handoff::ids::{IdLayout, MachineId};
use std::time::Duration;

/// Publishes `inputs`, waits for `outputs` of them, and for the work queue
/// to be settled and empty: nothing left that could come again (a message
/// not settled stays pending an ack; a nak'd one stays in the queue),
/// instead of sleeping past the ack wait. Every output seen.
async fn answered_and_settled(
    js: &jetstream::Context,
    collector: &Collector,
    inputs: &[Input],
    outputs: usize,
) -> Vec<Seen> {
    publish_all(js, inputs).await;
    assert!(collector.wait_for(outputs, Duration::from_secs(20)).await);
    assert!(
        wait_drained(js, Duration::from_secs(30)).await,
        "settled: {}",
        queue_state(js).await
    );
    collector.all()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_worker_dying_mid_run_loses_nothing() {
    let nats = Nats::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    capture_outputs(&js).await;
    let collector = Collector::start(&client).await;

    let doomed = LibWorker::start(&config, fixed_identity(1)).await;
    let survivors = vec![
        LibWorker::start(&config, fixed_identity(2)).await,
        LibWorker::start(&config, fixed_identity(3)).await,
    ];
    let n = 10_000;
    let inputs: Vec<Input> = (0..n).map(mixed).collect();
    let publisher = publish_in_background(&js, &inputs);
    assert!(collector.wait_for(n / 5, Duration::from_secs(60)).await);
    doomed.crash();
    println!("worker crashed after {} outputs", collector.len());
    publisher.await.expect("publisher");

    assert!(
        wait_drained(&js, Duration::from_secs(40)).await,
        "work queue not drained: {}",
        queue_state(&js).await
    );
    check_stored(&js, &inputs, None, "after a worker crash").await;
    assert_eq!(prefill_left(&js).await, 0);
    let (_, redelivered, _) = consumer_counters(&js).await;
    println!("consumer redeliveries: {redelivered}");
    for w in survivors {
        w.stop().await.expect("stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_nats_server_restart_mid_run_loses_nothing() {
    let mut nats = Nats::start();
    let config = config(&nats);
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(nats.url())
        .await
        .expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    capture_outputs(&js).await;
    let collector = Collector::start(&client).await;
    let workers = vec![
        LibWorker::start(&config, fixed_identity(1)).await,
        LibWorker::start(&config, fixed_identity(2)).await,
    ];
    restart_mid_run(&mut nats, &js, &collector, Duration::from_secs(60)).await;
    for w in workers {
        w.stop().await.expect("stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_poison_is_dead_lettered_once_and_terminated() {
    let nats = Nats::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    let collector = Collector::start(&client).await;
    let worker = LibWorker::start(&config, fixed_identity(5)).await;

    let no_reply_to = serde_json::to_vec(&serde_json::json!({
        "request_id": "no-reply-to", "frames": [{"finish_reason": "eos"}]
    }))
    .expect("json");
    let inputs = vec![
        Input {
            request_id: "poison-1".into(),
            payload: poison("poison-1"),
            json: false,
            expect: Expect::Dead,
        },
        Input {
            request_id: "no-reply-to".into(),
            payload: no_reply_to,
            json: true,
            expect: Expect::Dead,
        },
    ];
    let seen = answered_and_settled(&js, &collector, &inputs, 2).await;
    assert_eq!(seen.len(), 2, "each dead-lettered exactly once: {seen:?}");
    let code = |id: &str| {
        let s = seen.iter().find(|s| s.request_id == id).expect(id);
        s.headers
            .as_ref()
            .and_then(|h| h.get("Handoff-Error-Code"))
            .map(|v| v.as_str().to_string())
    };
    assert_eq!(code("poison-1").as_deref(), Some("malformed"));
    assert_eq!(code("no-reply-to").as_deref(), Some("missing_reply_to"));
    let (ack_pending, redelivered, pending) = consumer_counters(&js).await;
    assert_eq!(
        (ack_pending, redelivered, pending),
        (0, 0, 0),
        "terminated, never redelivered"
    );
    assert_eq!(prefill_left(&js).await, 0);
    worker.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_input_too_large_to_dead_letter_whole_goes_without_its_bytes() {
    let max = 16 * 1024;
    let nats = Nats::start_with_max_payload(Some(max));
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    let collector = Collector::start(&client).await;
    let worker = LibWorker::start(&config, fixed_identity(6)).await;

    // The input fits the stream (with its traceparent header), but neither
    // its decode job nor a dead letter of it (its bytes plus ~240 bytes of
    // headers) fits the server.
    let size = max - 200;
    let mut body = serde_json::json!({"request_id": "big", "reply_to": "llm.replies.big",
        "padding": "",
        "frames": [{"disaggregated_params": {"ctx_request_id": 3, "opaque_state": ""}}]});
    let room = size - serde_json::to_vec(&body).expect("json").len();
    body["padding"] = serde_json::json!("p".repeat(room));
    let payload = serde_json::to_vec(&body).expect("json");
    assert_eq!(payload.len(), size);
    let inputs = vec![Input {
        request_id: "big".into(),
        payload,
        json: true,
        expect: Expect::Dead,
    }];
    let seen = answered_and_settled(&js, &collector, &inputs, 1).await;
    assert_eq!(seen.len(), 1, "exactly one output: {seen:?}");
    let header = |name: &str| {
        seen[0]
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    assert_eq!(seen[0].subject, DEAD);
    assert!(seen[0].payload.is_empty(), "sent without the input's bytes");
    assert_eq!(header("Handoff-Error-Code").as_deref(), Some("too_large"));
    assert_eq!(
        header(prefill_handoff::headers::names::HANDOFF_PAYLOAD_OMITTED),
        Some(size.to_string())
    );
    assert_eq!(
        consumer_counters(&js).await,
        (0, 0, 0),
        "terminated, never redelivered"
    );
    assert_eq!(prefill_left(&js).await, 0);
    worker.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_fenced_worker_waits_then_mints_with_its_new_slot() {
    let nats = Nats::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    let collector = Collector::start(&client).await;
    // No slot: minting is refused until one is installed.
    let identity = prefill_handoff::identity::Identity::new(
        IdLayout::Rc22,
        prefill_handoff::ids::DEFAULT_EPOCH_UNIX_MS,
    );
    let worker = LibWorker::start(&config, identity.clone()).await;

    let mut inputs: Vec<Input> = (0..5).map(|i| needs_mint(&format!("mint-{i}"))).collect();
    inputs.extend((0..5).map(|i| Input::terminal(&format!("done-{i}"))));
    publish_all(&js, &inputs).await;

    // Results that need no ID flow while fenced; the others wait.
    assert!(collector.wait_for(5, Duration::from_secs(20)).await);
    // Every fenced result comes back at least once: by then each of them
    // was handled while fenced, and nothing may have been published for it.
    assert!(
        wait_redelivered(&js, 5, Duration::from_secs(60)).await,
        "the fenced results were nak'd and redelivered: {}",
        queue_state(&js).await
    );
    let seen = collector.all();
    assert!(
        seen.iter().all(|s| s.kind == Expect::Reply),
        "nothing may be published for results that need an ID while fenced: {seen:?}"
    );
    assert_eq!(seen.len(), 5);

    let slot = MachineId::new(321).expect("slot");
    identity.install(0x1234, slot, None);
    assert!(collector.wait_for(10, Duration::from_secs(30)).await);
    assert!(wait_drained(&js, Duration::from_secs(10)).await);
    let jobs: Vec<Seen> = collector
        .all()
        .into_iter()
        .filter(|s| s.kind == Expect::Gen)
        .collect();
    assert_eq!(jobs.len(), 5);
    for job in jobs {
        let value =
            prefill_handoff::wire::decode(&job.payload, prefill_handoff::wire::Encoding::MsgPack)
                .expect("decode job");
        let id = field(&value, "disagg_request_id")
            .and_then(|v| v.as_u64())
            .expect("minted disagg_request_id");
        let decoded = IdLayout::Rc22.decode(id).expect("an rc22 id");
        assert_eq!(
            decoded.machine_id,
            slot.get(),
            "{} minted with the installed slot",
            job.request_id
        );
    }
    worker.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_last_delivery_answers_identity_unavailable() {
    let nats = Nats::start();
    let mut config = config(&nats);
    config.jetstream.max_deliver = 3;
    config.jetstream.nak_delay_ms = 50;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    let collector = Collector::start(&client).await;
    let mut releases = client.subscribe("llm.kv.release").await.expect("subscribe");
    client.flush().await.expect("flush");
    let identity = prefill_handoff::identity::Identity::new(
        IdLayout::Rc22,
        prefill_handoff::ids::DEFAULT_EPOCH_UNIX_MS,
    );
    let worker = LibWorker::start(&config, identity).await;
    publish_all(&js, &[needs_mint("never-minted")]).await;

    assert!(collector.wait_for(1, Duration::from_secs(20)).await);
    // Settled after the last delivery: nothing more can be answered.
    assert!(wait_drained(&js, Duration::from_secs(30)).await);
    let seen = collector.all();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].kind, Expect::Reply);
    let value =
        prefill_handoff::wire::decode(&seen[0].payload, prefill_handoff::wire::Encoding::MsgPack)
            .expect("error response");
    let code = field(&value, "error")
        .and_then(|e| field(e, "code"))
        .and_then(|c| c.as_str());
    assert_eq!(code, Some("identity_unavailable"));
    assert_eq!(
        deliveries(&js).await,
        3,
        "one message, delivered max_deliver times before the error was sent"
    );
    // One KV release notice, with the answer: none with the deferrals.
    crate::common::worker_support::round_trip(&client).await;
    let mut notices = Vec::new();
    while let Ok(Some(notice)) = tokio::time::timeout(
        Duration::from_millis(200),
        futures::StreamExt::next(&mut releases),
    )
    .await
    {
        notices.push(notice);
    }
    assert_eq!(notices.len(), 1, "one release notice");
    let notice = prefill_handoff::wire::decode(
        &notices[0].payload,
        prefill_handoff::wire::Encoding::MsgPack,
    )
    .expect("a notice");
    assert_eq!(
        field(&notice, "reason").and_then(|r| r.as_str()),
        Some("identity_unavailable")
    );
    worker.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_failed_gen_publish_is_redelivered_until_stored() {
    let nats = Nats::start();
    let mut config = config(&nats);
    config.jetstream.create = false;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    js.delete_stream("LLM_GEN").await.expect("delete GEN");
    let worker = LibWorker::start(&config, fixed_identity(9)).await;

    let mut input = mixed(3); // SGLang: needs no ID
    input.request_id = "req-000003".into();
    publish_all(&js, &[input]).await;
    // Handled, failed to store, nak'd and delivered again: still there.
    assert!(
        wait_redelivered(&js, 1, Duration::from_secs(60)).await,
        "nak'd and redelivered: {}",
        queue_state(&js).await
    );
    assert_eq!(
        prefill_left(&js).await,
        1,
        "not acked while GEN cannot store it"
    );

    setup(&js, &config).await;
    assert!(wait_drained(&js, Duration::from_secs(20)).await);
    assert_eq!(
        gen_stream_request_ids(&js).await,
        vec!["req-000003".to_string()]
    );
    worker.stop().await.expect("stop");
}

/// GEN's duplicate window cannot be read at start (here the stream is
/// missing): the worker starts with the configured window, and the failure
/// is counted (and logged), not dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_an_unreadable_gen_duplicate_window_is_counted() {
    let nats = Nats::start();
    let mut config = config(&nats);
    config.jetstream.create = false;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    let mut without_gen = config.clone();
    without_gen.jetstream.gen_is_stream = false;
    setup(&js, &without_gen).await;
    let metrics = prefill_handoff::metrics::Metrics::new();
    let worker = prefill_handoff::pipeline::serve::start(
        &client,
        &config,
        fixed_identity(1),
        metrics.clone(),
        None,
        None,
    )
    .await
    .expect("the worker starts with the configured window");
    let scraped = metrics.encode();
    assert!(
        scraped.contains("handoff_gen_window_lookup_failures_total 1\n"),
        "{scraped}"
    );
    drop(worker);
}
