//! `prefill-handoff run` as a process at the edges of a shared bus (issue 9):
//! NATS unreachable at start, credentials written in `nats.url` (they
//! authenticate and are never printed), and an ID-service flood that must not
//! cost any decode job its ID.

use crate::common;
use crate::common::worker_support;

use common::messages::msgpack;
use common::{Etcd, Nats, Worker, free_port, http_get, prometheus_samples};
use futures::StreamExt;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::task::block_in_place;
use worker_support::{GEN, PREFILL};

const START: Duration = Duration::from_secs(30);
const PASSWORD: &str = "Sw0rdf1shPassw0rd";

fn wait_consuming(worker: &Worker) {
    let up = block_in_place(|| worker.wait_for_log("consuming prefill results", START));
    assert!(up, "the worker did not start:\n{}", worker.log());
}

/// A test client that authenticates as the server's user.
async fn client_as(nats: &Nats, user: &str) -> async_nats::Client {
    async_nats::ConnectOptions::with_user_and_password(user.into(), PASSWORD.into())
        .connect(nats.url())
        .await
        .expect("the test client connects")
}

/// Outputs on GEN and on every reply subject, as JSON values.
async fn outputs(
    client: &async_nats::Client,
) -> Arc<std::sync::Mutex<Vec<(String, serde_json::Value)>>> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    for subject in [GEN, "llm.replies.>"] {
        let mut sub = client.subscribe(subject).await.expect("subscribe");
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let value: serde_json::Value =
                    rmp_serde::from_slice(&m.payload).unwrap_or(serde_json::Value::Null);
                seen.lock().unwrap().push((m.subject.to_string(), value));
            }
        });
    }
    worker_support::round_trip(client).await;
    seen
}

/// A decode job (with a minted ID) and a terminal response, tagged `tag`.
async fn publish_two(client: &async_nats::Client, tag: &str) {
    for (i, frame) in [
        json!({"finish_reason": null, "disaggregated_params": {"ctx_request_id": 7}}),
        json!({"finish_reason": "stop", "text": "done"}),
    ]
    .into_iter()
    .enumerate()
    {
        let body = json!({
            "request_id": format!("{tag}-{i}"),
            "reply_to": format!("llm.replies.{tag}.{i}"),
            "frames": [frame],
        });
        client
            .publish(PREFILL, msgpack(&body).into())
            .await
            .expect("publish");
    }
    client.flush().await.expect("flush");
}

/// The exit codes of docs/protocol.md: with etcd up and nothing listening
/// on `nats.url`, `run` exits 1 within the connect timeout, with a one-line
/// error naming the URL, its password redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_unreachable_at_start_exits_1_naming_the_redacted_url() {
    let etcd = Etcd::start();
    let port = free_port();
    let url = format!("nats://u:{PASSWORD}@127.0.0.1:{port}");
    let (mut worker, _) =
        Worker::run_with_env(&url, &etcd, &[("HANDOFF_NATS__CONNECT_TIMEOUT_SECS", "2")]);
    let code = block_in_place(|| worker.wait_exit(Duration::from_secs(60)));
    let log = worker.log();
    assert_eq!(code, Some(1), "exit code; log:\n{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("prefill-handoff: ")
            && last.contains(&format!("nats://u:<redacted>@127.0.0.1:{port}"))
            && last.contains("nats.connect_timeout_secs"),
        "the last line names the URL and the key: {last:?}"
    );
    assert!(!log.contains(PASSWORD), "the password is shown:\n{log}");
    // The slot was given back on the way out.
    assert!(
        etcd.get_prefix("/llm/handoff/machine-ids/").is_empty(),
        "the slot key is revoked"
    );
}

/// Credentials written in `nats.url` authenticate, as in other NATS clients;
/// a wrong password is an error exit, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_the_url_authenticate() {
    let nats = Nats::start_with_user("handoff", PASSWORD);
    let etcd = Etcd::start();
    let (worker, _) = Worker::run_with_env(&nats.url_with_user(), &etcd, &[]);
    wait_consuming(&worker);
    let test = client_as(&nats, "handoff").await;
    let seen = outputs(&test).await;
    publish_two(&test, "auth").await;
    let answered = block_in_place(|| {
        common::poll_until_blocking(Duration::from_secs(20), || seen.lock().unwrap().len() >= 2)
    });
    assert!(
        answered,
        "the worker answers through the authenticated connection"
    );
    drop(worker);

    let wrong = format!("nats://handoff:not-{PASSWORD}@127.0.0.1:{}", nats.port);
    let (mut refused, _) = Worker::run_with_env(
        &wrong,
        &etcd,
        &[("HANDOFF_NATS__CONNECT_TIMEOUT_SECS", "2")],
    );
    let code = block_in_place(|| refused.wait_exit(Duration::from_secs(60)));
    assert_eq!(code, Some(1), "a wrong password: exit 1\n{}", refused.log());
}

/// docs/design.md: secrets are never shown. A worker whose URL holds a password,
/// logging at debug (async-nats included), through startup, traffic and
/// shutdown: the password is nowhere in its stdout or stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_url_appears_nowhere_in_the_output_at_debug() {
    let nats = Nats::start_with_user("handoff", PASSWORD);
    let etcd = Etcd::start();
    let (mut worker, _) = Worker::run_with_env(
        &nats.url_with_user(),
        &etcd,
        &[
            ("RUST_LOG", "debug"),
            ("HANDOFF_SHUTDOWN_TIMEOUT_SECS", "3"),
        ],
    );
    wait_consuming(&worker);
    let test = client_as(&nats, "handoff").await;
    let seen = outputs(&test).await;
    publish_two(&test, "debug").await;
    let some = block_in_place(|| {
        common::poll_until_blocking(Duration::from_secs(20), || seen.lock().unwrap().len() >= 2)
    });
    assert!(some, "traffic flows");
    worker.sigterm();
    let code = block_in_place(|| worker.wait_exit(Duration::from_secs(30)));
    assert_eq!(code, Some(0));
    let output = format!("{}\n{}", worker.log(), worker.stdout());
    let at = output.find(PASSWORD);
    assert!(
        at.is_none(),
        "the password is shown: ...{}...",
        at.map(|i| &output[i.saturating_sub(200)..(i + 50).min(output.len())])
            .unwrap_or_default()
    );
    // It did log at debug, including the NATS client's own lines about the
    // server it connects to.
    assert!(output.contains("DEBUG"), "logged at debug");
    assert!(output.contains("async_nats"), "the NATS client logged");
    assert!(output.contains("<redacted>"), "the URL is shown redacted");
}

/// Issue 9: clients asking the ID service for 1,024 IDs in a loop, during
/// normal traffic, never make a decode job answer `identity_unavailable`; the
/// service refuses what exceeds its own budget (`rate_limited`, counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn an_id_service_flood_never_makes_a_decode_job_identity_unavailable() {
    const FLOODERS: usize = 8;
    const FLOOD: Duration = Duration::from_secs(8);
    let nats = Nats::start();
    let etcd = Etcd::start();
    // A short lease: the slot's ID reservation reaches 3 s past the clock,
    // so a flood that outruns the slot's rate reaches its end within seconds.
    let (worker, metrics_addr) =
        Worker::run_with_env(&nats.url(), &etcd, &[("HANDOFF_LEASE_TTL_SECS", "3")]);
    wait_consuming(&worker);
    let test = worker_support::client(&nats.url()).await;
    let seen = outputs(&test).await;

    let stop = Arc::new(AtomicBool::new(false));
    let (granted, refused, other) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut flooders = Vec::new();
    for _ in 0..FLOODERS {
        let client = worker_support::client(&nats.url()).await;
        let (stop, granted, refused, other) = (
            Arc::clone(&stop),
            Arc::clone(&granted),
            Arc::clone(&refused),
            Arc::clone(&other),
        );
        flooders.push(tokio::spawn(async move {
            let body = msgpack(&json!({"count": 1024}));
            while !stop.load(Ordering::Relaxed) {
                let answer = tokio::time::timeout(
                    Duration::from_secs(5),
                    client.request("llm.handoff.ids", body.clone().into()),
                )
                .await;
                let Ok(Ok(answer)) = answer else {
                    other.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let value: serde_json::Value =
                    rmp_serde::from_slice(&answer.payload).unwrap_or_default();
                match value["error"]["code"].as_str() {
                    None if value["ids"].as_array().map(Vec::len) == Some(1024) => {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                    Some("rate_limited") => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        other.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }

    // Normal traffic meanwhile: TensorRT-LLM handoffs that need a minted ID,
    // about 200 per second.
    let mut sent = 0usize;
    let started = std::time::Instant::now();
    while started.elapsed() < FLOOD {
        for _ in 0..20 {
            let body = json!({
                "request_id": format!("f{sent}"),
                "reply_to": format!("llm.replies.f{sent}"),
                "frames": [{"finish_reason": null, "disaggregated_params": {"ctx_request_id": 7, "request_type": "context_only"}}],
            });
            test.publish(PREFILL, msgpack(&body).into()).await.unwrap();
            sent += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        let _ = f.await;
    }
    let all_out = block_in_place(|| {
        common::poll_until_blocking(Duration::from_secs(30), || {
            seen.lock().unwrap().len() >= sent
        })
    });
    let seen = seen.lock().unwrap().clone();
    assert!(all_out, "{} outputs for {sent} results", seen.len());
    let errors: Vec<&(String, serde_json::Value)> =
        seen.iter().filter(|(s, _)| s.as_str() != GEN).collect();
    assert!(
        errors.is_empty(),
        "{} of {sent} results were answered with an error instead of a decode job, e.g. {:?}",
        errors.len(),
        errors.first()
    );
    assert_eq!(seen.len(), sent);
    for (_, job) in &seen {
        assert!(job["disagg_request_id"].as_u64().is_some(), "minted: {job}");
    }
    let (granted, refused, other) = (
        granted.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed),
    );
    eprintln!(
        "flood: {granted} granted, {refused} rate_limited, {other} other; {sent} decode jobs"
    );
    assert!(granted > 0, "the service still hands out IDs");
    assert!(refused > 0, "the flood went beyond the service's budget");
    let samples = prometheus_samples(&http_get(metrics_addr.as_str(), "/metrics").body);
    let counted = samples
        .get("handoff_id_requests_total{result=\"rate_limited\"}")
        .copied()
        .unwrap_or_default();
    assert!(
        counted >= refused as f64,
        "refusals are counted: {counted} < {refused}"
    );
}
