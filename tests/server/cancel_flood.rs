//! A flood of cancels against a worker process (core mode, real etcd and
//! nats-server): 200,000 distinct request IDs, four times what the cancel
//! set holds. The worker stays up and ready, evicts and counts the oldest
//! cancels, its peak RSS stays within the bound the README states, and the
//! results sent afterwards all get their output.

use crate::common;

use bytes::Bytes;
use common::messages::{msgpack, terminal};
use common::{Etcd, Nats, Worker, http_get, poll_until, prometheus_samples};
use futures::StreamExt;
use std::time::Duration;
use tokio::task::block_in_place;

const CANCELS: usize = 200_000;
const RESULTS: usize = 200;
/// The peak RSS a worker may reach under the flood (README, "Deadlines and
/// cancellation"): its working size (about 22 MiB in this debug build), the
/// cancel set (at most `cancel.max_bytes`, 8 MiB) and the cancels the NATS
/// client buffers while the worker catches up (bounded by
/// `nats.subscription_bytes` of payload, each message several times its
/// payload in the client). Measured at 67-76 MiB.
const PEAK_RSS_MIB: u64 = 96;

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// A cancel of `chatcmpl-` and 36 characters (a UUID's length), as MessagePack.
fn cancel(i: usize) -> Bytes {
    let id = format!("chatcmpl-{i:036}");
    let body = serde_json::json!({"request_id": id});
    Bytes::from(rmp_serde::to_vec_named(&body).expect("encode"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_a_flood_of_cancels_stays_within_its_bounds() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let (mut worker, metrics_addr) =
        block_in_place(|| Worker::run_ready(&nats, &etcd, "core", &[], &[]));
    let pid = worker.pid().expect("running");
    let test = async_nats::connect(nats.url()).await.expect("connect");
    let before = vm_hwm_kib(pid);

    for i in 0..CANCELS {
        test.publish("llm.handoff.cancel", cancel(i))
            .await
            .expect("publish");
    }
    test.flush().await.expect("flush");

    // Every cancel taken (recorded: all distinct, none late) or dropped by
    // the client as a slow consumer, and counted either way.
    let scrape = || prometheus_samples(&http_get(&metrics_addr, "/metrics").body);
    let get = |samples: &std::collections::BTreeMap<String, f64>, name: &str| {
        samples.get(name).copied().unwrap_or(0.0) as usize
    };
    poll_until(Duration::from_secs(180), || async {
        let samples = block_in_place(scrape);
        let recorded = get(&samples, "handoff_cancels_total{event=\"recorded\"}");
        let drops = get(&samples, "handoff_nats_slow_consumer_drops_total");
        recorded + drops >= CANCELS
    })
    .await;
    let samples = block_in_place(scrape);
    let recorded = get(&samples, "handoff_cancels_total{event=\"recorded\"}");
    let evicted = get(&samples, "handoff_cancels_total{event=\"evicted\"}");
    let held = get(&samples, "handoff_cancels_held");
    let drops = get(&samples, "handoff_nats_slow_consumer_drops_total");
    let hwm = vm_hwm_kib(pid);
    eprintln!(
        "recorded {recorded}, evicted {evicted}, held {held}, dropped {drops}; VmHWM {} MiB ({} MiB before)",
        hwm / 1024,
        before / 1024
    );
    assert_eq!(recorded + drops, CANCELS, "every cancel counted");
    assert!(recorded > 100_000, "most cancels were taken: {recorded}");
    assert!(held <= 50_000, "the set holds at most cancel.max_entries");
    assert_eq!(evicted + held, recorded, "what the bounds drop is counted");
    assert!(
        hwm <= PEAK_RSS_MIB * 1024,
        "peak RSS {} MiB over the stated {PEAK_RSS_MIB} MiB",
        hwm / 1024
    );
    assert!(worker.is_running(), "the worker is up:\n{}", worker.log());
    let ready = block_in_place(|| http_get(&metrics_addr, "/readyz")).status;
    assert_eq!(ready, 200, "the worker is ready");

    // Results afterwards all get their output.
    let mut replies = test.subscribe("llm.replies.after.>").await.expect("sub");
    test.flush().await.expect("flush");
    for i in 0..RESULTS {
        test.publish(
            "llm.prefill.results",
            msgpack(&terminal(&format!("after.{i}"))).into(),
        )
        .await
        .expect("publish");
    }
    let mut seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < RESULTS {
        match tokio::time::timeout_at(deadline, replies.next()).await {
            Ok(Some(message)) => {
                assert!(seen.insert(message.subject.to_string()), "one output each");
            }
            _ => break,
        }
    }
    assert_eq!(seen.len(), RESULTS, "every result after the flood answered");
    worker.sigterm();
    assert_eq!(worker.wait_exit(Duration::from_secs(30)), Some(0));
}
