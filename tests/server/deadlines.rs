//! Deadlines and cancellation at the handoff (contract 10) against a real
//! nats-server, in core and JetStream mode: a result past its deadline or
//! cancelled gets its error response and one KV release notice, and no
//! decode job; a future deadline travels with the job; a cancel published
//! while no JetStream worker runs is still honoured.

use crate::common;
use crate::common::deadline_support::*;
use crate::common::jetstream_support::{self, LibWorker};
use crate::common::messages::msgpack;
use crate::common::worker_support::{self, InProcess, fixed_identity};

use common::{Nats, poll_until};
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_deadlines_are_decided_at_the_handoff() {
    let nats = Nats::start();
    let config = worker_support::config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(5)).await;
    let test = worker_support::client(&nats.url()).await;
    let watch = Watch::start(&test).await;

    let now = now_ms();
    let cases = deadline_cases(now);
    for (_, publish, _, _) in &cases {
        test.publish_with_headers(
            PREFILL,
            publish.headers.clone(),
            publish.body.clone().into(),
        )
        .await
        .expect("publish");
    }
    let expected = cases.len() + cases.iter().filter(|c| c.3).count();
    watch.wait(expected, || worker.settled()).await;
    check_deadline_cases(&watch, &cases, now + 600_000);
    assert_eq!(watch.count(), expected, "nothing else was published");
    let report = worker.stop().await;
    assert_eq!(report.counts.failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_cancels_refuse_the_handoff_and_release_the_kv() {
    let nats = Nats::start();
    let config = worker_support::config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(6)).await;
    let test = worker_support::client(&nats.url()).await;
    let watch = Watch::start(&test).await;

    for (id, _, json_encoded) in CANCELLED {
        let c = cancel(id, json_encoded);
        test.publish_with_headers(CANCEL, c.headers, c.body.into())
            .await
            .expect("publish");
    }
    // A malformed one: counted, never answered, not fatal.
    test.publish(CANCEL, b"\xc1 not a cancel".to_vec().into())
        .await
        .expect("publish");
    // The cancel listener and the results are separate subscriptions: the
    // results go once the worker holds the cancels.
    assert!(
        poll_until(WAIT, || async {
            cancels_counted(&worker, "recorded") == 3.0
        })
        .await,
        "the worker records the three cancels"
    );
    assert!(
        poll_until(WAIT, || async {
            cancels_counted(&worker, "malformed") == 1.0
        })
        .await
    );
    for (id, backend, _) in CANCELLED {
        test.publish(PREFILL, msgpack(&result(id, backend, false)).into())
            .await
            .expect("publish");
    }
    test.publish(PREFILL, msgpack(&result(KEPT, "trtllm", false)).into())
        .await
        .expect("publish");
    watch
        .wait(CANCELLED.len() * 2 + 1, || worker.settled())
        .await;
    check_cancels(&watch);
    assert_eq!(watch.count(), CANCELLED.len() * 2 + 1);

    // A cancel after the decode job left: counted as late.
    let late = cancel(KEPT, false);
    test.publish_with_headers(CANCEL, late.headers, late.body.into())
        .await
        .expect("publish");
    assert!(
        poll_until(WAIT, || async { cancels_counted(&worker, "late") == 1.0 }).await,
        "a cancel after the job left is late"
    );
    let report = worker.stop().await;
    assert_eq!(report.counts.failed, 0);
}

fn js_config(nats: &Nats) -> prefill_handoff::config::Config {
    jetstream_support::config(nats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_deadlines_and_cancels_kept_while_no_worker_ran() {
    let nats = Nats::start();
    let config = js_config(&nats);
    let test = worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    let watch = Watch::start(&test).await;

    // No worker runs: the cancels are kept by the cancel stream, the
    // results by the prefill stream.
    for (id, _, json_encoded) in CANCELLED {
        js_publish(&js, CANCEL, cancel(id, json_encoded)).await;
    }
    for (id, backend, _) in CANCELLED {
        js_publish(&js, PREFILL, plain(&result(id, backend, false))).await;
    }
    js_publish(&js, PREFILL, plain(&result(KEPT, "trtllm", false))).await;
    let now = now_ms();
    let cases = deadline_cases(now);
    for (_, publish, _, _) in cases {
        js_publish(&js, PREFILL, publish).await;
    }
    let cases = deadline_cases(now);

    let worker = LibWorker::start(&config, jetstream_support::fixed_identity(8)).await;
    let expected = CANCELLED.len() * 2 + 1 + cases.len() + cases.iter().filter(|c| c.3).count();
    watch
        .wait(expected, || jetstream_support::drained(&js))
        .await;
    check_cancels(&watch);
    check_deadline_cases(&watch, &cases, now + 600_000);
    assert_eq!(watch.count(), expected, "nothing else was published");
    assert!(
        jetstream_support::wait_drained(&js, WAIT).await,
        "every result acked"
    );
    worker.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_a_redelivery_after_the_deadline_is_deadline_exceeded() {
    let nats = Nats::start();
    let config = js_config(&nats);
    let test = worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    let watch = Watch::start(&test).await;
    // A worker without a slot cannot mint the ID a TensorRT-LLM handoff
    // needs: it asks for redelivery until the deadline has passed, and then
    // the deadline decides without an ID.
    let fenced = prefill_handoff::identity::Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    let worker = LibWorker::start(&config, fenced).await;
    let deadline = now_ms() + 1_500;
    let body = with_deadline(result("late", "trtllm", false), json!(deadline));
    js_publish(&js, PREFILL, plain(&body)).await;

    watch.wait(2, || jetstream_support::drained(&js)).await;
    assert_eq!(
        watch.replies().get("late"),
        Some(&vec!["deadline_exceeded".to_string()])
    );
    assert_eq!(watch.releases().get("late").map(Vec::len), Some(1));
    assert!(watch.jobs().is_empty(), "no decode job");
    assert!(
        jetstream_support::deliveries(&js).await > 1,
        "answered on a redelivery"
    );
    assert!(jetstream_support::wait_drained(&js, WAIT).await);
    worker.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_an_unconsumed_job_leaves_gen_at_its_deadline_on_2_11_and_later() {
    let nats = Nats::start();
    let version = nats.version();
    if !prefill_handoff::setup::supports_msg_ttl(&version) {
        println!("nats-server {version} has no per-message TTL; nothing to check");
        return;
    }
    let config = js_config(&nats);
    let test = worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    let worker = LibWorker::start(&config, jetstream_support::fixed_identity(9)).await;
    let body = with_deadline(result("expiring", "sglang", false), json!(now_ms() + 2_000));
    js_publish(&js, PREFILL, plain(&body)).await;
    js_publish(&js, PREFILL, plain(&result("lasting", "sglang", false))).await;

    let gen_messages = || async {
        let mut stream = js.get_stream("LLM_GEN").await.expect("GEN");
        stream.info().await.expect("info").state.messages
    };
    let held = std::cell::Cell::new(0);
    poll_until(WAIT, || async {
        held.set(gen_messages().await);
        held.get() >= 2
    })
    .await;
    assert_eq!(held.get(), 2, "both jobs stored");
    // Gone within a generous bound after its deadline; the job without a
    // deadline stays.
    poll_until(WAIT, || async { gen_messages().await <= 1 }).await;
    let left = jetstream_support::stream_contents(&js, "LLM_GEN").await;
    let ids: Vec<&str> = left.iter().map(|s| s.request_id.as_str()).collect();
    assert_eq!(ids, ["lasting"], "the expired job left GEN");
    worker.stop().await.expect("stop");
}

/// `prefill-handoff cancel` as an operator runs it.
fn cancel_command(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
        .arg("cancel")
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run prefill-handoff cancel")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_the_cancel_command_cancels_for_every_worker() {
    let nats = Nats::start();
    let config = worker_support::config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(10)).await;
    let test = worker_support::client(&nats.url()).await;
    let watch = Watch::start(&test).await;
    let url = nats.url();
    let out = tokio::task::block_in_place(|| {
        cancel_command(&["--nats-url", &url, "--reason", "operator", "--json", "op-1"])
    });
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "cancelled op-1\n");
    assert!(
        poll_until(WAIT, || async {
            cancels_counted(&worker, "recorded") == 1.0
        })
        .await
    );
    test.publish(PREFILL, msgpack(&result("op-1", "vllm", false)).into())
        .await
        .expect("publish");
    watch.wait(2, || worker.settled()).await;
    assert_eq!(
        watch.replies().get("op-1"),
        Some(&vec!["cancelled".to_string()])
    );
    assert_eq!(watch.releases().get("op-1").map(Vec::len), Some(1));
    // A request ID the contract cannot hold is a usage error.
    let long = "x".repeat(257);
    let out = tokio::task::block_in_place(|| cancel_command(&["--nats-url", &url, &long]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_the_cancel_command_stores_its_cancels() {
    let nats = Nats::start();
    let config = js_config(&nats);
    let test = worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    let url = nats.url();
    let out = tokio::task::block_in_place(|| {
        cancel_command(&["--nats-url", &url, "--mode", "jetstream", "op-1", "op-2"])
    });
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut kept = js.get_stream("LLM_CANCEL").await.expect("cancel stream");
    assert_eq!(kept.info().await.expect("info").state.messages, 2);
}
