//! A GEN stream at its limits with discard policy `new` refuses every decode
//! job (issue 40). In JetStream mode no result is acked without its decode
//! job stored, the worker holds the refused results without burning their
//! deliveries, says so (metric, log line, `/readyz`), and everything flows
//! once the limit is raised. In core mode a decode job is a plain publish:
//! a full GEN stream drops it and the worker cannot tell (docs/design.md).

use crate::common;
use crate::common::jetstream_support::*;

use async_nats::jetstream;
use common::{Etcd, Nats, Worker, http_get, poll_until, prometheus_samples};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::task::block_in_place;

/// Sets the GEN stream's message limit with discard policy `new`, as an
/// operator would (`nats stream edit`); `-1` lifts it. Through the raw API,
/// so that fields the client's stream config does not know (the per-message
/// TTL of nats-server 2.11+, which cannot be switched off) are sent back as
/// the server holds them.
pub(crate) async fn limit_gen(js: &jetstream::Context, max_messages: i64) {
    let client = js.client();
    let info = client
        .request("$JS.API.STREAM.INFO.LLM_GEN", "".into())
        .await
        .expect("GEN info");
    let info: serde_json::Value = serde_json::from_slice(&info.payload).expect("GEN info JSON");
    let mut config = info["config"].clone();
    config["discard"] = "new".into();
    config["max_msgs"] = max_messages.into();
    let body = serde_json::to_vec(&config).expect("config JSON");
    let reply = client
        .request("$JS.API.STREAM.UPDATE.LLM_GEN", body.into())
        .await
        .expect("update GEN");
    let reply: serde_json::Value = serde_json::from_slice(&reply.payload).expect("reply JSON");
    assert!(reply.get("error").is_none(), "update GEN: {reply}");
}

async fn gen_stored(js: &jetstream::Context) -> u64 {
    let stream = js.get_stream("LLM_GEN").await.expect("GEN stream");
    stream.get_info().await.expect("GEN info").state.messages
}

/// The GEN stream holds a decode job for each of `wanted`, once each, and
/// nothing else.
async fn each_decode_job_stored_once(
    js: &jetstream::Context,
    wanted: impl IntoIterator<Item = &Input>,
) {
    let stored = gen_stream_request_ids(js).await;
    let unique: BTreeSet<&String> = stored.iter().collect();
    assert_eq!(unique.len(), stored.len(), "each decode job stored once");
    let wanted: BTreeSet<&String> = wanted.into_iter().map(|i| &i.request_id).collect();
    assert_eq!(unique, wanted, "every decode job is in GEN");
}

fn metric(addr: &str, series: &str) -> Option<f64> {
    prometheus_samples(&http_get(addr, "/metrics").body)
        .get(series)
        .copied()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_full_gen_holds_results_until_room_returns() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let mut config = config(&nats);
    // A short redelivery schedule: a worker that nak'd a refused result
    // would use up all four deliveries within about a second, and the
    // result would then stay in the work queue with no output, for good.
    config.jetstream.max_deliver = 4;
    config.jetstream.nak_delay_ms = 100;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = jetstream::new(client.clone());
    setup(&js, &config).await;
    capture_outputs(&js).await;
    let room = 10;
    limit_gen(&js, room).await;

    // The operator manages the streams: with jetstream.create the worker's
    // setup would put the GEN stream's limits back to its own.
    let settings = [
        "jetstream.create=false",
        "jetstream.ack_wait_secs=2",
        "jetstream.nak_delay_ms=100",
        "jetstream.max_deliver=4",
    ];
    let (worker, metrics) =
        block_in_place(|| Worker::run_ready(&nats, &etcd, "jetstream", &settings, &[]));
    assert_eq!(metric(&metrics, "handoff_gen_refusing"), Some(0.0));

    let inputs: Vec<Input> = (0..60).map(mixed).collect();
    let decode = inputs.iter().filter(|i| i.expect == Expect::Gen).count() as u64;
    let others = inputs.len() as u64 - decode;
    publish_all(&js, &inputs).await;

    // GEN stores `room` decode jobs and refuses the rest; replies and dead
    // letters do not need GEN and go out.
    assert!(
        wait_outputs(&js, others, Duration::from_secs(30)).await,
        "results that need no GEN are answered meanwhile"
    );
    poll_until(Duration::from_secs(30), || async {
        gen_stored(&js).await >= room as u64
    })
    .await;
    assert_eq!(gen_stored(&js).await, room as u64);
    // Longer than the whole redelivery schedule: every refused result is
    // still in the work queue, none acked without its decode job.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(gen_stored(&js).await, room as u64);
    assert_eq!(
        prefill_left(&js).await,
        decode - room as u64,
        "every result whose decode job GEN refused is still in the work queue: {}",
        queue_state(&js).await
    );

    // Visible: a metric, a log line, and `/readyz`.
    assert_eq!(
        metric(&metrics, "handoff_gen_refusing"),
        Some(1.0),
        "the worker says GEN is refusing:\n{}",
        worker.log()
    );
    assert!(
        metric(&metrics, "handoff_gen_refusals_total").is_some_and(|n| n >= 1.0),
        "refusals are counted"
    );
    assert!(
        worker.log().contains("the GEN stream refuses decode jobs"),
        "a log line says GEN is refusing:\n{}",
        worker.log()
    );
    let ready = http_get(&metrics, "/readyz");
    assert_eq!(ready.status, 503, "not ready while GEN refuses");
    assert!(ready.body.contains("gen_accepting"), "{}", ready.body);

    // Room returns: every held result flows, each decode job stored once.
    limit_gen(&js, -1).await;
    assert!(
        wait_drained(&js, Duration::from_secs(60)).await,
        "everything flows once GEN has room: {}",
        queue_state(&js).await
    );
    let wanted = inputs.iter().filter(|i| i.expect == Expect::Gen);
    each_decode_job_stored_once(&js, wanted).await;
    let accepting = block_in_place(|| {
        common::poll_until_blocking(Duration::from_secs(10), || {
            metric(&metrics, "handoff_gen_refusing") == Some(0.0)
                && http_get(&metrics, "/readyz").status == 200
        })
    });
    assert!(accepting, "ready again once GEN accepts:\n{}", worker.log());
    assert!(
        worker
            .log()
            .contains("the GEN stream accepts decode jobs again")
    );
}

/// A worker asked to stop while it holds results for a full GEN hands
/// them back to the work queue at once (nak) instead of waiting out its
/// shutdown timeout and leaving them to the ack wait: it exits with
/// nothing unfinished, and another worker takes them as soon as GEN has
/// room. Both waits are a minute here, so either old way would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_a_stopping_worker_hands_its_held_results_back() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = jetstream::new(client.clone());
    setup(&js, &config).await;
    let room = 4;
    limit_gen(&js, room).await;
    let settings = [
        "jetstream.create=false",
        "jetstream.ack_wait_secs=60",
        "jetstream.nak_delay_ms=100",
        "shutdown_timeout_secs=60",
    ];
    let (mut worker, metrics) =
        block_in_place(|| Worker::run_ready(&nats, &etcd, "jetstream", &settings, &[]));
    let inputs: Vec<Input> = (0..20).map(|i| needs_mint(&format!("held-{i}"))).collect();
    publish_all(&js, &inputs).await;
    let holding = block_in_place(|| {
        common::poll_until_blocking(Duration::from_secs(30), || {
            metric(&metrics, "handoff_gen_refusing") == Some(1.0)
        })
    });
    assert!(
        holding,
        "GEN refuses and results are held:\n{}",
        worker.log()
    );
    assert_eq!(gen_stored(&js).await, room as u64);

    worker.sigterm();
    let exit = block_in_place(|| worker.wait_exit(Duration::from_secs(30)));
    assert_eq!(
        exit,
        Some(0),
        "stopped without waiting for GEN:\n{}",
        worker.log()
    );
    let log = worker.log();
    assert!(
        log.contains("unfinished=0"),
        "nothing left unsettled:\n{log}"
    );
    assert!(!log.contains("shutdown timeout ran out"), "{log}");

    // Room returns; another worker takes what was handed back, before the
    // minute's ack wait of the first worker's deliveries would run out.
    limit_gen(&js, -1).await;
    let (_next, _) =
        block_in_place(|| Worker::run_ready(&nats, &etcd, "jetstream", &settings, &[]));
    assert!(
        wait_drained(&js, Duration::from_secs(30)).await,
        "the handed-back results are taken at once: {}",
        queue_state(&js).await
    );
    each_decode_job_stored_once(&js, &inputs).await;
}

/// Core mode publishes a decode job without waiting for a stream: a full
/// GEN stream drops it, and the worker counts it as published. What the
/// documents say (docs/design.md, "A full GEN stream"), held here.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn core_mode_decode_jobs_into_a_full_jetstream_gen_are_dropped_unseen() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = jetstream::new(client.clone());
    setup(&js, &config).await;
    // Full: room for one message, taken by one the test stores first.
    limit_gen(&js, 1).await;
    js.publish(GEN, r#"{"request_id":"filler"}"#.into())
        .await
        .expect("publish")
        .await
        .expect("GEN stores the filler");
    let collector = Collector::start(&client).await;
    let (worker, metrics) = block_in_place(|| Worker::run_ready(&nats, &etcd, "core", &[], &[]));

    let input = mixed(3); // SGLang: a decode job, needs no ID
    client
        .publish(PREFILL, input.payload.clone().into())
        .await
        .expect("publish");
    assert!(
        collector.wait_for(1, Duration::from_secs(20)).await,
        "no output:\n{}",
        worker.log()
    );
    assert_eq!(collector.all()[0].kind, Expect::Gen);
    assert_eq!(
        gen_stream_request_ids(&js).await,
        vec!["filler".to_string()],
        "the full GEN stream kept only the filler"
    );
    assert_eq!(
        metric(&metrics, "handoff_decode_jobs_total{backend=\"sglang\"}"),
        Some(1.0),
        "counted as published"
    );
    assert_eq!(metric(&metrics, "handoff_gen_refusing"), Some(0.0));
    drop(worker);
}

/// How many replies and dead letters the capture stream holds, polled until
/// it reaches `n` or `timeout` passes.
async fn wait_outputs(js: &jetstream::Context, n: u64, timeout: Duration) -> bool {
    poll_until(timeout, || async {
        let stream = js.get_stream("OUTPUTS").await.expect("capture stream");
        stream.get_info().await.expect("info").state.messages >= n
    })
    .await
}
