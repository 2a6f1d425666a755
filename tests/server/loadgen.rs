//! `prefill-handoff loadgen` against the raw relays on a real nats-server:
//! it counts every output once, and it fails (exit 1) when outputs are
//! missing, duplicated or of the wrong kind. Then against the real worker:
//! every kind of the mix gets the output the contract calls for.

use crate::common;

use common::{Etcd, Nats, Worker, free_port};
use prefill_handoff_loadgen::relay::{CoreRelay, JsRelay, JsRelaySettings};
use serde_json::Value;
use std::process::Command;

/// Runs loadgen to completion; (exit code, JSON report, stderr).
fn loadgen(nats: &Nats, args: &[&str]) -> (Option<i32>, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
        .arg("loadgen")
        .args([
            "--nats-url",
            &nats.url(),
            "--namespace",
            "lgtest",
            "--json",
            "--quiet",
        ])
        .args(args)
        .output()
        .expect("run prefill-handoff loadgen");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("loadgen printed no JSON report ({e}); stderr: {stderr}"));
    (out.status.code(), report, stderr)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// Starts a core relay from the prefill subject to GEN on `rt`; with a queue
/// group several relays share the messages, without one each gets them all.
fn core_relay(rt: &tokio::runtime::Runtime, nats: &Nats, queue: Option<&str>) {
    let url = nats.url();
    let relay = rt.block_on(async {
        let client = async_nats::connect(url).await.expect("connect");
        CoreRelay::start(client, "lgtest.prefill.results", queue, "lgtest.gen.jobs")
            .await
            .expect("start the relay")
    });
    rt.spawn(relay.run());
}

#[test]
fn every_relayed_output_is_matched_once_and_the_run_exits_0() {
    let nats = Nats::start();
    let rt = runtime();
    core_relay(&rt, &nats, Some("lgtest-handoff"));
    core_relay(&rt, &nats, Some("lgtest-handoff"));

    let (code, report, stderr) = loadgen(
        &nats,
        &[
            "--count",
            "3000",
            "--warmup",
            "100",
            "--expect-relay",
            "--timeout",
            "20",
        ],
    );
    assert_eq!(code, Some(0), "{report:#}\n{stderr}");
    assert_eq!(report["ok"], true);
    assert_eq!(report["sent"], 3000);
    assert_eq!(report["matched"], 3000);
    assert_eq!(report["received"]["relayed"], 3000, "warm-up not counted");
    assert_eq!(report["warmup_received"], 100);
    assert_eq!(report["missing"], 0);
    assert_eq!(report["duplicates"], 0);
    assert!(report["throughput"].as_f64().unwrap_or(0.0) > 0.0);
    let l = &report["latency_ms"];
    let p = |k: &str| l[k].as_f64().unwrap_or(-1.0);
    assert!(
        0.0 < p("p50") && p("p50") <= p("p90") && p("p90") <= p("p99") && p("p99") <= p("max"),
        "{l}"
    );
}

#[test]
fn a_paced_run_sends_everything_and_matches_it() {
    let nats = Nats::start();
    let rt = runtime();
    core_relay(&rt, &nats, Some("lgtest-handoff"));

    let (code, report, stderr) = loadgen(
        &nats,
        &[
            "--count",
            "400",
            "--rate",
            "400",
            "--expect-relay",
            "--timeout",
            "20",
        ],
    );
    assert_eq!(code, Some(0), "{report:#}\n{stderr}");
    assert_eq!(report["matched"], 400);
    // That the pacer never sends early is checked on its arithmetic, not on
    // the wall clock: src/loadgen/driver.rs, a_message_is_never_due_before_its_time.
}

#[test]
fn missing_outputs_are_counted_and_the_run_exits_1() {
    let nats = Nats::start();
    // No relay: nothing answers.
    let (code, report, stderr) = loadgen(&nats, &["--count", "50", "--timeout", "0.5"]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["ok"], false);
    assert_eq!(report["sent"], 50);
    assert_eq!(report["matched"], 0);
    assert_eq!(report["missing"], 50);
    assert_eq!(report["missing_examples"].as_array().map(Vec::len), Some(5));
    assert!(stderr.contains("50 of 50 outputs missing"), "{stderr}");
}

#[test]
fn duplicated_outputs_are_counted_and_the_run_exits_1() {
    let nats = Nats::start();
    let rt = runtime();
    // Two relays outside any queue group: every message is relayed twice.
    core_relay(&rt, &nats, None);
    core_relay(&rt, &nats, None);

    let (code, report, stderr) = loadgen(
        &nats,
        &[
            "--count",
            "200",
            "--expect-relay",
            "--timeout",
            "20",
            "--linger-ms",
            "1000",
        ],
    );
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["matched"], 200);
    assert_eq!(report["missing"], 0);
    assert_eq!(report["duplicates"], 200);
    assert_eq!(report["received"]["relayed"], 400);
    assert!(stderr.contains("200 duplicated"), "{stderr}");
}

#[test]
fn outputs_of_the_wrong_kind_fail_the_run() {
    let nats = Nats::start();
    let rt = runtime();
    core_relay(&rt, &nats, Some("lgtest-handoff"));

    // Without --expect-relay a relayed prefill result is not the decode job,
    // terminal or error response the mix calls for.
    let (code, report, _) = loadgen(&nats, &["--count", "40", "--timeout", "20"]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["matched"], 40);
    assert_eq!(report["wrong_kind"], 40);
}

#[test]
fn jetstream_publishes_are_acked_and_the_durable_relay_delivers_every_one() {
    let nats = Nats::start();
    let rt = runtime();
    let url = nats.url();
    let relay = rt.block_on(async {
        let client = async_nats::connect(url).await.expect("connect");
        JsRelay::start(client, JsRelaySettings::for_namespace("lgtest"))
            .await
            .expect("create streams and consumer")
    });
    rt.spawn(relay.run());

    let (code, report, stderr) = loadgen(
        &nats,
        &[
            "--count",
            "2000",
            "--jetstream",
            "--expect-relay",
            "--timeout",
            "30",
        ],
    );
    assert_eq!(code, Some(0), "{report:#}\n{stderr}");
    assert_eq!(report["publish_errors"], 0);
    assert_eq!(report["matched"], 2000);
    assert_eq!(report["duplicates"], 0);
}

#[test]
fn jetstream_publish_without_a_stream_reports_publish_errors() {
    let nats = Nats::start();
    let (code, report, stderr) =
        loadgen(&nats, &["--count", "5", "--jetstream", "--timeout", "0.2"]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["publish_errors"], 5);
    assert!(stderr.contains("5 publishes failed"), "{stderr}");
}

/// Starts `prefill-handoff run` in `mode` and waits until it consumes.
fn spawn_worker(nats: &Nats, etcd: &Etcd, mode: &str) -> Worker {
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let worker = Worker::spawn(
        &[
            "run",
            "--nats-url",
            &nats.url(),
            "--etcd-endpoints",
            &etcd.endpoint(),
            "--namespace",
            "lgtest",
            "--metrics-addr",
            &metrics_addr,
            "--mode",
            mode,
        ],
        &[("NO_COLOR", "1")],
    );
    let up = worker.wait_for_log(
        "consuming prefill results",
        std::time::Duration::from_secs(30),
    );
    assert!(up, "the worker did not start:\n{}", worker.log());
    worker
}

/// 800 messages in 8 shares: 4 decode, 1 terminal, 2 error, 1 dead letter.
const EVERY_KIND: &str = "trtllm=1,sglang=1,vllm=1,opaque=1,terminal=1,error=2,dead=1";

fn assert_every_kind_answered(report: &Value) {
    assert_eq!(report["wrong_kind"], 0, "{report:#}");
    assert_eq!(report["duplicates"], 0, "{report:#}");
    assert_eq!(report["received"]["decode"], 400);
    assert_eq!(report["received"]["terminal"], 100);
    assert_eq!(report["received"]["error"], 200);
    assert_eq!(report["received"]["dead_letter"], 100);
}

#[test]
fn against_the_core_worker_every_kind_gets_its_contract_output() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let worker = spawn_worker(&nats, &etcd, "core");
    let (code, report, stderr) = loadgen(
        &nats,
        &["--count", "800", "--mix", EVERY_KIND, "--timeout", "20"],
    );
    assert_eq!(code, Some(0), "{report:#}\n{stderr}\n{}", worker.log());
    assert_every_kind_answered(&report);
}

/// A tenth of the results cancelled before the run (the benchmark's
/// cancelled run): each of those gets error `cancelled`, the rest their job.
#[test]
fn against_the_core_worker_cancelled_results_get_cancelled() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let worker = spawn_worker(&nats, &etcd, "core");
    let (code, report, stderr) = loadgen(
        &nats,
        &[
            "--count",
            "1000",
            "--mix",
            "trtllm=9,cancelled=1",
            "--timeout",
            "20",
        ],
    );
    assert_eq!(code, Some(0), "{report:#}\n{stderr}\n{}", worker.log());
    assert_eq!(report["wrong_kind"], 0, "{report:#}");
    assert_eq!(report["received"]["decode"], 900, "{report:#}");
    assert_eq!(report["received"]["error"], 100, "{report:#}");
}

#[test]
fn against_the_jetstream_worker_every_acked_message_gets_its_contract_output() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let worker = spawn_worker(&nats, &etcd, "jetstream");
    let (code, report, stderr) = loadgen(
        &nats,
        &[
            "--count",
            "800",
            "--mix",
            EVERY_KIND,
            "--jetstream",
            "--timeout",
            "30",
        ],
    );
    assert_eq!(code, Some(0), "{report:#}\n{stderr}\n{}", worker.log());
    assert_eq!(report["publish_errors"], 0);
    assert_every_kind_answered(&report);
}

#[test]
fn a_bad_mix_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
        .args(["loadgen", "--mix", "trtllm=80,gpt=20"])
        .output()
        .expect("run loadgen");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown kind \"gpt\""), "{stderr}");
}
