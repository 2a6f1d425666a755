//! The handoff as the engines live it (contract 11) against a real
//! nats-server, in core and JetStream mode: the TensorRT-LLM ID policy, the
//! KV's lifetime (by field, header, an engine's hold counted from the
//! stream's stored time, and while a full GEN holds the result), and a
//! release notice with every refusal of a valid handoff.

use crate::common;
use crate::common::deadline_support::*;
use crate::common::jetstream_support::{self, LibWorker};
use crate::common::messages::{header, msgpack};
use crate::common::worker_support::{self, InProcess, fixed_identity};

use common::{Etcd, Nats, Worker, poll_until};
use prefill_handoff::config::{Config, MissingDisaggRequestId};
use prefill_handoff::ids::IdLayout;
use serde_json::{Value as Json, json};
use std::time::{Duration, Instant};
use tokio::task::block_in_place;

/// A TensorRT-LLM result for `id`, decode-bound, with `disagg_request_id`
/// absent, null or kept.
fn trt(id: &str, disagg: Option<Json>) -> Json {
    let mut body = result(id, "trtllm", false);
    if let Some(disagg) = disagg {
        body["frames"][0]["disaggregated_params"]["disagg_request_id"] = disagg;
    }
    body
}

const KEPT: u64 = 1_099_511_627_777;

async fn publish(test: &async_nats::Client, body: &Json, headers: async_nats::HeaderMap) {
    test.publish_with_headers(PREFILL, headers, msgpack(body).into())
        .await
        .expect("publish");
}

/// The one release notice of `id`, as a map: its reason.
fn release_reason(watch: &Watch, id: &str) -> Option<String> {
    let releases = watch.releases();
    let notices = releases.get(id)?;
    assert_eq!(notices.len(), 1, "{id}: one release notice");
    Some(notices[0].0["reason"].as_str()?.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_the_trtllm_id_policies_decide_a_result_without_its_id() {
    let nats = Nats::start();
    let test = worker_support::client(&nats.url()).await;
    let watch = Watch::start(&test).await;
    for policy in ["refuse", "pass", "mint"] {
        let mut config = Config::default();
        config.nats.url = nats.url();
        config.trtllm.missing_disagg_request_id = match policy {
            "refuse" => MissingDisaggRequestId::Refuse,
            "pass" => MissingDisaggRequestId::Pass,
            _ => MissingDisaggRequestId::Mint,
        };
        let config = config.resolve().expect("config");
        let worker = InProcess::start(&config, fixed_identity(5)).await;
        let id = |what: &str| format!("{policy}-{what}");
        let before = watch.count();
        publish(&test, &trt(&id("absent"), None), Default::default()).await;
        publish(
            &test,
            &trt(&id("null"), Some(Json::Null)),
            Default::default(),
        )
        .await;
        publish(
            &test,
            &trt(&id("kept"), Some(json!(KEPT))),
            Default::default(),
        )
        .await;
        publish(
            &test,
            &result(&id("terminal"), "trtllm", true),
            Default::default(),
        )
        .await;
        let refused = policy == "refuse";
        // Four answers, and a release notice per refusal.
        watch
            .wait(before + 4 + if refused { 2 } else { 0 }, || {
                worker.settled()
            })
            .await;
        let replies = watch.replies();
        let jobs = watch.jobs();
        for missing in ["absent", "null"] {
            let rid = id(missing);
            match policy {
                "refuse" => {
                    assert_eq!(
                        replies.get(&rid),
                        Some(&vec!["missing_disagg_request_id".to_string()])
                    );
                    assert_eq!(
                        release_reason(&watch, &rid).as_deref(),
                        Some("missing_disagg_request_id")
                    );
                    assert!(!jobs.contains_key(&rid), "{rid}: no decode job");
                }
                "pass" => {
                    let job = &jobs[&rid][0].0;
                    assert!(job["disagg_request_id"].is_null(), "{rid}: {job}");
                    assert_eq!(job["handoff"]["request_type"], "generation_only");
                    assert_eq!(
                        job["handoff"].get("disagg_request_id"),
                        trt(
                            &rid,
                            if missing == "null" {
                                Some(Json::Null)
                            } else {
                                None
                            }
                        )["frames"][0]["disaggregated_params"]
                            .get("disagg_request_id")
                    );
                    assert_eq!(release_reason(&watch, &rid), None);
                }
                _ => {
                    let job = &jobs[&rid][0].0;
                    let minted = job["disagg_request_id"].as_u64().expect("minted");
                    assert_eq!(IdLayout::Rc22.decode(minted).map(|d| d.machine_id), Ok(5));
                    assert_eq!(job["handoff"]["disagg_request_id"], minted);
                }
            }
        }
        let kept = &jobs[&id("kept")][0].0;
        assert_eq!(
            kept["disagg_request_id"], KEPT,
            "{policy}: a kept ID is untouched"
        );
        assert_eq!(kept["handoff"]["disagg_request_id"], KEPT);
        assert_eq!(
            replies.get(&id("terminal")),
            Some(&vec!["terminal".to_string()])
        );
        assert_eq!(
            watch.count(),
            before + 4 + if refused { 2 } else { 0 },
            "{policy}: nothing else"
        );
        let report = worker.stop().await;
        assert_eq!(report.counts.failed, 0);
    }
}

#[test]
fn an_unknown_policy_is_a_configuration_error_naming_the_key() {
    // Refused before any network contact.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
        .args(["run", "--set", "trtllm.missing_disagg_request_id=sometimes"])
        .output()
        .expect("run prefill-handoff");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("trtllm.missing_disagg_request_id"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_the_kv_expiry_by_field_header_and_both() {
    let nats = Nats::start();
    let config = worker_support::config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(6)).await;
    let test = worker_support::client(&nats.url()).await;
    let watch = Watch::start(&test).await;
    let mut jobs_sub = test.subscribe(GEN).await.expect("subscribe");
    test.flush().await.expect("flush");

    let now = now_ms();
    let (past, future) = (now - 60_000, now + 600_000);
    let kv_header = |ms: &str| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Handoff-KV-Expires", ms);
        headers
    };
    let with_kv = |mut body: Json, kv: Json| {
        body["kv_expires_ms"] = kv;
        body
    };
    // (id, body, header, the reply or "job", a release notice)
    let cases: Vec<(&str, Json, Option<String>, &str, bool)> = vec![
        (
            "field-past",
            with_kv(result("field-past", "vllm", false), json!(past)),
            None,
            "kv_expired",
            true,
        ),
        (
            "header-past",
            result("header-past", "sglang", false),
            Some(past.to_string()),
            "kv_expired",
            true,
        ),
        (
            "field-ahead-header-past",
            with_kv(
                result("field-ahead-header-past", "vllm", false),
                json!(future),
            ),
            Some(past.to_string()),
            "kv_expired",
            true,
        ),
        (
            "field-ahead",
            with_kv(result("field-ahead", "vllm", false), json!(future)),
            None,
            "job",
            false,
        ),
        (
            "header-ahead",
            result("header-ahead", "sglang", false),
            Some(future.to_string()),
            "job",
            false,
        ),
        (
            "field-invalid",
            with_kv(result("field-invalid", "vllm", false), json!("soon")),
            None,
            "invalid_kv_expires",
            false,
        ),
        (
            "header-invalid",
            result("header-invalid", "vllm", false),
            Some("1.5".into()),
            "invalid_kv_expires",
            false,
        ),
        (
            "terminal-past",
            with_kv(result("terminal-past", "vllm", true), json!(past)),
            None,
            "terminal",
            false,
        ),
        (
            "deadline-wins",
            with_deadline(
                with_kv(result("deadline-wins", "trtllm", false), json!(past)),
                json!(past),
            ),
            None,
            "deadline_exceeded",
            true,
        ),
    ];
    for (_, body, header, _, _) in &cases {
        let headers = header.as_deref().map(kv_header).unwrap_or_default();
        publish(&test, body, headers).await;
    }
    let expected = cases.len() + cases.iter().filter(|c| c.4).count();
    watch.wait(expected, || worker.settled()).await;
    assert_eq!(watch.count(), expected, "nothing else was published");
    let (replies, jobs) = (watch.replies(), watch.jobs());
    for (id, _, _, want, release) in &cases {
        if *want == "job" {
            let job = &jobs[*id][0].0;
            assert_eq!(
                job["kv_expires_ms"], future,
                "{id}: the job carries the expiry"
            );
        } else {
            assert_eq!(replies.get(*id), Some(&vec![want.to_string()]), "{id}");
            assert!(!jobs.contains_key(*id), "{id}: no decode job");
        }
        let reason = release_reason(&watch, id);
        assert_eq!(
            reason.is_some(),
            *release,
            "{id}: release notice {reason:?}"
        );
        if let Some(reason) = reason {
            assert_eq!(&reason, want, "{id}: the notice's reason is the code");
        }
    }
    // The jobs carry the expiry in their header too.
    for _ in 0..2 {
        let job = tokio::time::timeout(WAIT, futures::StreamExt::next(&mut jobs_sub))
            .await
            .expect("a job")
            .expect("a message");
        assert_eq!(
            header(job.headers.as_ref(), "Handoff-KV-Expires"),
            Some(future.to_string().as_str())
        );
    }
    let report = worker.stop().await;
    assert_eq!(report.counts.failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_a_fenced_worker_under_mint_answers_identity_unavailable_with_one_release_notice() {
    let nats = Nats::start();
    let config = worker_support::config(&nats.url());
    // Never given a slot: fenced from the start.
    let fenced = prefill_handoff::identity::Identity::new(
        IdLayout::Rc22,
        prefill_handoff::ids::DEFAULT_EPOCH_UNIX_MS,
    );
    let worker = InProcess::start(&config, fenced).await;
    let test = worker_support::client(&nats.url()).await;
    let watch = Watch::start(&test).await;
    publish(&test, &trt("fenced", None), Default::default()).await;
    watch.wait(2, || worker.settled()).await;
    assert_eq!(
        watch.replies().get("fenced"),
        Some(&vec!["identity_unavailable".to_string()])
    );
    assert_eq!(
        release_reason(&watch, "fenced").as_deref(),
        Some("identity_unavailable")
    );
    let notice = &watch.releases()["fenced"][0].0;
    assert_eq!(
        notice["handoff"],
        trt("fenced", None)["frames"][0]["disaggregated_params"]
    );
    assert_eq!(watch.count(), 2);
    worker.stop().await;
}

/// A result stored longer ago than its engine's hold, before any worker
/// ran, has no KV left: `kv_expired` and a release notice; a result of an
/// engine without a hold goes to decode.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_a_result_stored_longer_ago_than_the_kv_hold_is_kv_expired() {
    let nats = Nats::start();
    let mut config = jetstream_support::config(&nats);
    config.kv_hold_ms.vllm = 1_500;
    let test = worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    let watch = Watch::start(&test).await;

    js_publish(&js, PREFILL, plain(&result("held-too-long", "vllm", false))).await;
    js_publish(&js, PREFILL, plain(&result("no-hold", "sglang", false))).await;
    // The hold runs out while no worker runs.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let worker = LibWorker::start(&config, jetstream_support::fixed_identity(7)).await;
    watch.wait(3, || jetstream_support::drained(&js)).await;
    assert_eq!(
        watch.replies().get("held-too-long"),
        Some(&vec!["kv_expired".to_string()])
    );
    assert_eq!(
        release_reason(&watch, "held-too-long").as_deref(),
        Some("kv_expired")
    );
    let jobs = watch.jobs();
    assert_eq!(jobs["no-hold"].len(), 1);
    assert!(jobs["no-hold"][0].0.get("kv_expires_ms").is_none());
    assert!(!jobs.contains_key("held-too-long"));
    assert_eq!(watch.count(), 3);
    worker.stop().await.expect("stop");
}

/// A result held while GEN refuses decode jobs is answered `kv_expired`
/// once its KV expires, not kept until GEN has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_a_result_held_for_a_full_gen_is_answered_kv_expired_when_its_kv_expires() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let config = jetstream_support::config(&nats);
    let test = worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    // GEN at its limit: one message stored, room for none more.
    crate::jetstream_gen_full::limit_gen(&js, 1).await;
    js_publish(&js, GEN, plain(&json!({"request_id": "filler"}))).await;
    let watch = Watch::start(&test).await;
    let settings = ["jetstream.create=false", "jetstream.ack_wait_secs=60"];
    let (worker, _metrics) =
        block_in_place(|| Worker::run_ready(&nats, &etcd, "jetstream", &settings, &[]));

    let expires = now_ms() + 3_000;
    let mut body = result("held", "vllm", false);
    body["kv_expires_ms"] = json!(expires);
    js_publish(&js, PREFILL, plain(&body)).await;
    let started = Instant::now();
    assert!(
        poll_until(WAIT, || async { watch.replies().contains_key("held") }).await,
        "the held result is answered:\n{}",
        worker.log()
    );
    let answered_at = now_ms();
    assert_eq!(watch.replies()["held"], vec!["kv_expired".to_string()]);
    assert!(answered_at >= expires, "not before its KV expired");
    // Well before the ack wait (60 s) would have redelivered it: it was not
    // kept waiting for room in GEN.
    assert!(started.elapsed() < Duration::from_secs(30));
    // Everything is in once the result is acked.
    watch.wait(2, || jetstream_support::drained(&js)).await;
    assert_eq!(
        release_reason(&watch, "held").as_deref(),
        Some("kv_expired")
    );
    // Its tries reach GEN's subscribers (a stream refusing a message does
    // not stop the publish), but the stream never stored it.
    let stream = js.get_stream("LLM_GEN").await.expect("GEN stream");
    let stored = stream.get_info().await.expect("GEN info").state.messages;
    assert_eq!(stored, 1, "only the filler is in GEN");
    drop(worker);
}
