//! `prefill-handoff run` as a process against real nats-server and etcd:
//! two workers share mixed traffic, and SIGTERM under load drains, answers
//! everything accepted, revokes the lease and exits 0.

use crate::common;
use crate::common::worker_support;

use common::messages::msgpack;
use common::{Etcd, Nats, Worker, free_port, poll_until};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::task::block_in_place;
use worker_support::cases::{self, Case};
use worker_support::{Collector, GEN, PREFILL, client, outputs_counted};

const START: Duration = Duration::from_secs(30);

/// Starts `run` against the servers and waits until it consumes.
/// `run` with `extra` environment, once it consumes; with its metrics address.
fn spawn_worker(nats: &Nats, etcd: &Etcd, extra: &[(&str, &str)]) -> (Worker, String) {
    let (worker, metrics) = Worker::run_with_env(&nats.url(), etcd, extra);
    let up = block_in_place(|| worker.wait_for_log("consuming prefill results", START));
    assert!(up, "the worker did not start:\n{}", worker.log());
    (worker, metrics)
}

/// The leased keys under `/llm/handoff/` (slot and instance keys): the
/// slots' persistent ID floors (`id-floors/`) outlive every lease by design.
fn leased_keys(etcd: &Etcd) -> Vec<(String, String)> {
    let mut keys = etcd.get_prefix("/llm/handoff/");
    keys.retain(|(key, _)| !key.starts_with("/llm/handoff/id-floors/"));
    keys
}

/// The value of `key=` on the first log line containing `message`.
fn log_field(log: &str, message: &str, key: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains(message))?;
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    let value: String = line[start..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    Some(value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn two_run_processes_share_mixed_traffic_with_their_own_slots() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let (a, a_metrics) = spawn_worker(&nats, &etcd, &[]);
    let (b, b_metrics) = spawn_worker(&nats, &etcd, &[]);
    let slot_of = |w: &Worker| {
        log_field(&w.log(), "identity held", "machine_id")
            .and_then(|m| m.parse::<u64>().ok())
            .expect("the worker logs its machine ID")
    };
    let (slot_a, slot_b) = (slot_of(&a), slot_of(&b));
    assert_ne!(slot_a, slot_b);
    let slots = etcd.get_prefix("/llm/handoff/machine-ids/");
    let mut held: Vec<String> = slots.iter().map(|(k, _)| k.clone()).collect();
    held.sort();
    let mut expected = vec![
        format!("/llm/handoff/machine-ids/{slot_a}"),
        format!("/llm/handoff/machine-ids/{slot_b}"),
    ];
    expected.sort();
    assert_eq!(held, expected);

    let test = client(&nats.url()).await;
    let collector = Collector::start(&test).await;
    let all: Vec<Case> = (0..6)
        .flat_map(|r| cases::mixed(&format!("p{r}")))
        .collect();
    cases::publish(&test, &all).await;
    // Settled: the workers' counters add up to every result.
    let answered = || async {
        block_in_place(|| outputs_counted(&a_metrics) + outputs_counted(&b_metrics))
            >= all.len() as u64
    };
    let outputs = collector
        .wait_outputs(all.len(), Duration::from_secs(20), answered)
        .await;
    let machine_ids = cases::check(&all, &outputs);
    assert!(
        machine_ids.contains(&Some(slot_a)) && machine_ids.contains(&Some(slot_b)),
        "both workers hand off, each with its own slot: {machine_ids:?} vs {slot_a}, {slot_b}"
    );
    // Every decode job names a live instance.
    let instances = etcd.get_prefix("/llm/handoff/instances/");
    for message in outputs.iter().filter(|m| m.subject.as_str() == GEN) {
        let job: serde_json::Value = rmp_serde::from_slice(&message.payload).unwrap();
        let instance = job["worker"]["instance_id"].as_str().unwrap();
        assert!(
            instances.iter().any(|(k, _)| k.ends_with(instance)),
            "{instance} is not registered: {instances:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn sigterm_under_load_answers_everything_accepted_revokes_and_exits_zero() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let (mut worker, _) = spawn_worker(&nats, &etcd, &[("HANDOFF_SHUTDOWN_TIMEOUT_SECS", "5")]);
    assert_eq!(leased_keys(&etcd).len(), 2, "slot and instance keys");

    let test = client(&nats.url()).await;
    let collector = Collector::start(&test).await;
    // Load: a publisher that keeps going until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let publisher = {
        let (test, stop, sent) = (test.clone(), Arc::clone(&stop), Arc::clone(&sent));
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let body = if i.is_multiple_of(3) {
                    json!({"request_id": format!("l{i}"), "reply_to": format!("llm.replies.l{i}"), "frames": [{"finish_reason": "eos"}]})
                } else {
                    json!({"request_id": format!("l{i}"), "reply_to": format!("llm.replies.l{i}"),
                        "frames": [{"disaggregated_params": {"ctx_request_id": i, "request_type": "context_only"}}]})
                };
                test.publish(PREFILL, msgpack(&body).into()).await.unwrap();
                i += 1;
                sent.store(i, Ordering::Relaxed);
                if i.is_multiple_of(200) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            test.flush().await.unwrap();
        })
    };
    // Under load for a while, then SIGTERM.
    poll_until(Duration::from_secs(20), || async {
        collector.outputs().len() >= 2000
    })
    .await;
    assert!(
        collector.outputs().len() >= 2000,
        "the worker handles the load"
    );
    worker.sigterm();
    let signalled = Instant::now();
    let code = block_in_place(|| worker.wait_exit(Duration::from_secs(5 + 5)));
    let took = signalled.elapsed();
    // The slot and instance keys go with the revoked lease, not after its TTL.
    let left = leased_keys(&etcd);
    stop.store(true, Ordering::Relaxed);
    publisher.await.unwrap();
    let log = worker.log();
    assert_eq!(code, Some(0), "exit code after SIGTERM ({took:?}):\n{log}");
    assert!(left.is_empty(), "keys left after exit: {left:?}");

    let received: u64 = log_field(&log, "worker stopped", "received")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no shutdown report in the log:\n{log}"));
    let published: u64 = log_field(&log, "worker stopped", "published")
        .and_then(|v| v.parse().ok())
        .unwrap();
    eprintln!(
        "sent {} results; the worker took {received} and answered {published}; exit after {took:?}",
        sent.load(Ordering::Relaxed)
    );
    assert_eq!(published, received, "every accepted result was answered");
    assert!(
        received < sent.load(Ordering::Relaxed),
        "load continued past the drain"
    );
    // The worker has exited: nothing more is coming.
    let outputs = collector
        .wait_outputs(received as usize, Duration::from_secs(10), || async {
            true
        })
        .await;
    assert_eq!(
        outputs.len() as u64,
        received,
        "one output per accepted result, seen on the bus"
    );
    for step in [
        "shutdown requested",
        "shutdown: draining subscriptions",
        "shutdown: flushing NATS",
        "shutdown: revoking the etcd lease",
        "shutdown complete",
    ] {
        assert!(log.contains(step), "missing log step {step:?}:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn run_reconnects_after_nats_restarts_and_processes_new_results() {
    let mut nats = Nats::start();
    let etcd = Etcd::start();
    let (worker, _) = spawn_worker(&nats, &etcd, &[]);
    nats.kill();
    block_in_place(|| {
        assert!(
            worker.wait_for_log("NATS connection lost", START),
            "{}",
            worker.log()
        )
    });
    nats.restart();
    let test = client(&nats.url()).await;
    // Core NATS loses what is published before the worker resubscribes: ask
    // until a request is answered on its NATS reply subject.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut attempt = 0;
    let answer = loop {
        attempt += 1;
        assert!(
            Instant::now() < deadline,
            "no answer after the restart:\n{}",
            worker.log()
        );
        let body = json!({"request_id": format!("after-{attempt}"),
            "frames": [{"disaggregated_params": {"ctx_request_id": 5, "request_type": "context_only"}, "finish_reason": "eos"}]});
        match tokio::time::timeout(
            Duration::from_millis(500),
            test.request(PREFILL, msgpack(&body).into()),
        )
        .await
        {
            Ok(Ok(reply)) => break reply,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let out: serde_json::Value = rmp_serde::from_slice(&answer.payload).unwrap();
    assert_eq!(out["kind"], "terminal");
    assert_eq!(out["request_id"], format!("after-{attempt}"));
    assert!(worker.log().contains("NATS connection re-established"));
}

#[test]
fn run_without_etcd_exits_1_naming_the_endpoint() {
    let nats = Nats::start();
    let dead = format!("http://127.0.0.1:{}", free_port());
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let mut worker = Worker::spawn(
        &["run"],
        &[
            ("HANDOFF_NATS__URL", nats.url().as_str()),
            ("HANDOFF_ETCD__ENDPOINTS", dead.as_str()),
            ("HANDOFF_METRICS_ADDR", metrics_addr.as_str()),
        ],
    );
    let code = worker.wait_exit(Duration::from_secs(30));
    let log = worker.log();
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains(&dead), "the message names the endpoint: {log}");
    assert!(log.contains("cannot obtain an etcd lease"), "{log}");
}

#[test]
fn sigterm_while_waiting_for_nats_exits_zero_and_revokes() {
    let etcd = Etcd::start();
    let no_nats = format!("nats://127.0.0.1:{}", free_port());
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let mut worker = Worker::spawn(
        &["run"],
        &[
            ("HANDOFF_NATS__URL", no_nats.as_str()),
            ("HANDOFF_ETCD__ENDPOINTS", etcd.endpoint().as_str()),
            ("HANDOFF_METRICS_ADDR", metrics_addr.as_str()),
        ],
    );
    assert!(
        worker.wait_for_log("identity held", START),
        "{}",
        worker.log()
    );
    assert!(!leased_keys(&etcd).is_empty());
    std::thread::sleep(Duration::from_millis(300));
    assert!(!worker.log().contains("consuming prefill results"));
    worker.sigterm();
    let code = worker.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{}", worker.log());
    assert!(leased_keys(&etcd).is_empty(), "lease revoked");
}
