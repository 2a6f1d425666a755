//! Issue 14: the worker as a hop of the request's trace. `prefill-handoff run`
//! against real nats-server and etcd, exporting to a real OTLP/gRPC receiver
//! (tests/common/otlp.rs): one span per result, a child of the incoming
//! `traceparent`, with the outcome's attributes, and the output's
//! `traceparent` naming that span. With the collector down or hung, every
//! result still gets its one output, memory stays flat, and the drops are
//! counted.

use crate::common;
use crate::common::worker_support;

use common::jetstream_support;
use common::messages::{self, header, msgpack};
use common::otlp::{HungCollector, OtlpReceiver, ReceivedSpan};
use common::{Etcd, Nats, Worker, free_port, http_get, poll_until, prometheus_samples};
use futures::StreamExt as _;
use serde_json::json;
use std::time::Duration;
use tokio::task::block_in_place;
use worker_support::{DEAD, GEN, PREFILL, client, outputs_counted};

const START: Duration = Duration::from_secs(30);
const SPANS: Duration = Duration::from_secs(30);

/// Starts `run` with `extra` settings and waits until it consumes; returns
/// it and its metrics address.
fn spawn_worker(nats: &Nats, etcd: &Etcd, extra: &[(&str, &str)]) -> (Worker, String) {
    let (worker, metrics_addr) = Worker::run_with_env(&nats.url(), etcd, extra);
    let up = block_in_place(|| worker.wait_for_log("consuming prefill results", START));
    assert!(up, "the worker did not start:\n{}", worker.log());
    (worker, metrics_addr)
}

/// `00-{trace}-{parent}-{flags}` split into its three fields.
fn split_traceparent(value: &str) -> (String, String, String) {
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "a traceparent: {value}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

fn traceparent(trace_id: &str, parent_id: &str, flags: &str) -> String {
    format!("00-{trace_id}-{parent_id}-{flags}")
}

/// One input of the run: its body, reply subject and trace header.
struct Input {
    body: Vec<u8>,
    traceparent: Option<String>,
}

fn decode_job(request_id: &str, reply: &str) -> Vec<u8> {
    msgpack(&json!({
        "request_id": request_id,
        "reply_to": reply,
        "frames": [{
            "token_ids": [1],
            "finish_reason": null,
            "disaggregated_params": {"ctx_request_id": 77, "request_type": "context_only", "opaque_state": "abc"},
        }],
    }))
}

/// A terminal result answered on `reply`.
fn terminal_on(request_id: &str, reply: &str) -> Vec<u8> {
    let mut result = messages::terminal(request_id);
    result["reply_to"] = reply.into();
    msgpack(&result)
}

/// Not a map: a dead letter (`malformed`).
fn junk(tag: &str) -> Vec<u8> {
    msgpack(&json!(format!("junk-{tag}")))
}

async fn publish(nats: &async_nats::Client, input: &Input) {
    let mut headers = async_nats::HeaderMap::new();
    if let Some(tp) = &input.traceparent {
        headers.insert("traceparent", tp.as_str());
        headers.insert("tracestate", "vendor=1");
    }
    nats.publish_with_headers(PREFILL, headers, input.body.clone().into())
        .await
        .expect("publish");
}

/// The spans named `handoff.result` in the trace `trace_id`.
fn results_in<'a>(spans: &'a [ReceivedSpan], trace_id: &str) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.name == "handoff.result" && s.trace_id == trace_id)
        .collect()
}

/// The whole contract of issue 14 for one delivery mode and OTLP protocol.
async fn each_result_gets_one_span_under_its_trace(mode: &str, protocol: &str) {
    let receiver = match protocol {
        "grpc" => OtlpReceiver::start().await,
        _ => OtlpReceiver::start_http().await,
    };
    let nats = Nats::start();
    let etcd = Etcd::start();
    let (worker, metrics) = spawn_worker(
        &nats,
        &etcd,
        &[
            ("HANDOFF_MODE", mode),
            ("HANDOFF_OTEL__ENDPOINT", &receiver.endpoint),
            ("HANDOFF_OTEL__PROTOCOL", protocol),
            // Roots are sampled too: the result without a traceparent.
            ("HANDOFF_OTEL__SAMPLING_RATIO", "1"),
        ],
    );
    let test = client(&nats.url()).await;
    // The outputs' subjects only (under `llm.>`): a `>` subscriber would
    // answer (by never answering) the durable mode's confirmation probes,
    // which expect no responder.
    let collector = jetstream_support::Collector::start(&test).await;

    let (t_decode, t_terminal, t_dead, t_unsampled) = (
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "5bf92f3577b34da6a3ce929d0e0e4737",
        "6bf92f3577b34da6a3ce929d0e0e4738",
        "7bf92f3577b34da6a3ce929d0e0e4739",
    );
    let parent = "00f067aa0ba902b7";
    let inputs = [
        Input {
            body: decode_job("r-decode", "llm.replies.decode"),
            traceparent: Some(traceparent(t_decode, parent, "01")),
        },
        Input {
            body: terminal_on("r-terminal", "llm.replies.terminal"),
            traceparent: Some(traceparent(t_terminal, parent, "01")),
        },
        Input {
            body: junk(mode),
            traceparent: Some(traceparent(t_dead, parent, "01")),
        },
        Input {
            body: terminal_on("r-unsampled", "llm.replies.unsampled"),
            traceparent: Some(traceparent(t_unsampled, parent, "00")),
        },
        Input {
            body: terminal_on("r-root", "llm.replies.root"),
            traceparent: None,
        },
    ];
    for input in &inputs {
        publish(&test, input).await;
    }
    // Every output is here once the worker's counter has every input
    // answered and a fence came back behind them.
    let answered = poll_until(Duration::from_secs(20), || async {
        block_in_place(|| outputs_counted(&metrics)) >= inputs.len() as u64
    })
    .await;
    collector.fence().await;
    let outputs = collector.all();
    assert!(
        answered,
        "{} of {} outputs: {outputs:?}",
        outputs.len(),
        inputs.len()
    );
    assert_eq!(
        outputs.len(),
        inputs.len(),
        "one output per input: {outputs:?}"
    );
    let on = |subject: &str| -> Vec<&jetstream_support::Seen> {
        outputs
            .iter()
            .filter(|m| m.subject.as_str() == subject)
            .collect()
    };
    let one = |subject: &str| -> String {
        let found = on(subject);
        assert_eq!(found.len(), 1, "one output on {subject}: {outputs:?}");
        header(found[0].headers.as_ref(), "traceparent")
            .unwrap_or_else(|| panic!("the output on {subject} carries a traceparent"))
            .to_string()
    };
    let out_decode = one(GEN);
    let out_terminal = one("llm.replies.terminal");
    let out_dead = one(DEAD);
    let out_unsampled = one("llm.replies.unsampled");
    let out_root = one("llm.replies.root");
    // tracestate travels on unchanged.
    assert_eq!(
        header(on(GEN)[0].headers.as_ref(), "tracestate"),
        Some("vendor=1")
    );

    let (_, root_span, _) = split_traceparent(&out_root);
    let (root_trace, _, _) = split_traceparent(&out_root);
    let spans = receiver
        .wait_until(SPANS, |spans| {
            [t_decode, t_terminal, t_dead, root_trace.as_str()]
                .iter()
                .all(|t| !results_in(spans, t).is_empty())
                && spans
                    .iter()
                    .any(|s| s.name == "handoff.identity.slot_claimed")
        })
        .await;

    // (input, its trace, the output's traceparent, expected outcome attributes)
    let sampled = [
        (
            "decode",
            t_decode,
            &out_decode,
            vec![("handoff.outcome", "decode"), ("handoff.backend", "trtllm")],
        ),
        (
            "terminal",
            t_terminal,
            &out_terminal,
            vec![
                ("handoff.outcome", "terminal"),
                ("handoff.finish_reason", "eos"),
            ],
        ),
        (
            "dead letter",
            t_dead,
            &out_dead,
            vec![
                ("handoff.outcome", "dead_letter"),
                ("handoff.dead_letter_code", "malformed"),
            ],
        ),
    ];
    for (name, trace_id, out, attributes) in sampled {
        let found = results_in(&spans, trace_id);
        assert_eq!(found.len(), 1, "{name}: one span in its trace: {spans:#?}");
        let span = found[0];
        assert_eq!(span.parent_span_id, parent, "{name}: parented to the input");
        assert_eq!(span.service, "prefill-handoff", "{name}");
        assert_eq!(
            *out,
            traceparent(trace_id, &span.span_id, "01"),
            "{name}: the output's traceparent names the worker's span"
        );
        for (key, want) in attributes {
            assert_eq!(span.str(key), Some(want), "{name}: {key}: {span:#?}");
        }
        assert_eq!(span.str("messaging.system"), Some("nats"), "{name}");
        assert_eq!(
            span.str("messaging.destination.name"),
            Some(PREFILL),
            "{name}"
        );
        assert_eq!(span.int("handoff.delivery_attempt"), Some(1), "{name}");
        assert!(
            span.int("handoff.machine_id")
                .is_some_and(|m| (0..1021).contains(&m)),
            "{name}: machine ID: {span:#?}"
        );
        assert!(
            span.int("messaging.message.body.size")
                .is_some_and(|n| n > 0),
            "{name}: input size"
        );
        assert!(
            span.int("handoff.output.size").is_some_and(|n| n > 0),
            "{name}: output size"
        );
        for stage in ["decided", "published"] {
            assert!(
                span.events.iter().any(|e| e == stage),
                "{name}: {stage}: {:?}",
                span.events
            );
        }
        if mode == "jetstream" {
            let settle = if name == "dead letter" { "term" } else { "ack" };
            assert_eq!(span.str("handoff.settle"), Some(settle), "{name}");
            assert!(span.events.iter().any(|e| e == "settled"), "{name}");
        }
    }
    let dead = results_in(&spans, t_dead)[0];
    assert_eq!(dead.status, 2, "a dead letter's span has error status");

    // An unsampled parent: nothing exported, but the output still names
    // the worker's (unrecorded) span, flags 00, in the same trace.
    assert!(results_in(&spans, t_unsampled).is_empty());
    let (trace, span_id, flags) = split_traceparent(&out_unsampled);
    assert_eq!((trace.as_str(), flags.as_str()), (t_unsampled, "00"));
    assert_ne!(
        span_id, parent,
        "the unsampled output names the worker's span"
    );

    // No traceparent: a new root, which the output joins.
    let roots = results_in(&spans, &root_trace);
    assert_eq!(roots.len(), 1, "one root span: {spans:#?}");
    assert_eq!(roots[0].parent_span_id, "", "a root has no parent");
    assert_eq!(roots[0].span_id, root_span);

    // Identity: the slot claimed at start, as a span of its own.
    assert!(
        spans
            .iter()
            .any(|s| s.name == "handoff.identity.slot_claimed"
                && s.int("handoff.machine_id").is_some()),
        "slot claimed: {spans:#?}"
    );
    // Logs of sampled results name their trace (the dead letter is logged at warn).
    let log = worker.log();
    assert!(
        log.lines()
            .any(|l| l.contains("dead") && l.contains(&format!("trace_id={t_dead}"))),
        "the dead letter's log line carries its trace_id:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn core_each_result_gets_one_span_under_its_incoming_trace() {
    each_result_gets_one_span_under_its_trace("core", "grpc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn core_spans_reach_an_otlp_http_collector_too() {
    each_result_gets_one_span_under_its_trace("core", "http").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn jetstream_each_result_gets_one_span_under_its_incoming_trace() {
    each_result_gets_one_span_under_its_trace("jetstream", "grpc").await;
}

/// The worker's resident memory, from /proc.
fn rss_kib(worker: &Worker) -> u64 {
    let pid = worker.pid().expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

fn metric(addr: &str, series: &str) -> f64 {
    let reply = http_get(addr, "/metrics");
    prometheus_samples(&reply.body)
        .get(series)
        .copied()
        .unwrap_or(-1.0)
}

/// `rounds` rounds of `per_round` sampled results, each round waiting for
/// every output; the RSS after each round (KiB). The worker's metrics are at
/// `metrics`.
async fn rounds_of_traffic(
    nats: &Nats,
    (worker, metrics): (&Worker, &str),
    rounds: usize,
    per_round: usize,
) -> Vec<u64> {
    let test = client(&nats.url()).await;
    let mut replies = test.subscribe("llm.replies.>").await.expect("subscribe");
    test.flush().await.expect("flush");
    let mut rss = Vec::new();
    let mut n = 0u64;
    for round in 0..rounds {
        for i in 0..per_round {
            n += 1;
            let input = Input {
                body: terminal_on(&format!("r{round}-{i}"), "llm.replies.load"),
                traceparent: Some(traceparent(&format!("{n:032x}"), "00f067aa0ba902b7", "01")),
            };
            publish(&test, &input).await;
        }
        test.flush().await.expect("flush");
        for i in 0..per_round {
            let got = tokio::time::timeout(Duration::from_secs(60), replies.next()).await;
            assert!(
                matches!(got, Ok(Some(_))),
                "round {round}: output {i} of {per_round} did not arrive ({}): every result gets its one output",
                n
            );
        }
        rss.push(rss_kib(worker));
    }
    // Nothing beyond one output each: the worker's counter says it has
    // answered every result (an extra output would come before its count),
    // and a fence sent through the server behind them comes next.
    let answered = poll_until(Duration::from_secs(60), || async {
        block_in_place(|| outputs_counted(metrics)) >= n
    })
    .await;
    assert!(answered, "the worker counts {n} results answered");
    let fence = format!("llm.replies.test-fence.{}", test.new_inbox());
    test.publish(fence.clone(), "".into())
        .await
        .expect("publish a fence");
    let next = tokio::time::timeout(Duration::from_secs(10), replies.next())
        .await
        .expect("the fence comes back")
        .expect("the subscription is open");
    assert_eq!(
        next.subject.as_str(),
        fence,
        "no output beyond one per result"
    );
    rss
}

/// Growth allowed between the RSS after the first rounds and after the last:
/// an allocator's and the NATS client's noise, well below what keeping
/// every span would cost (24,000 spans of ~1.5 KiB: ~35 MiB).
const RSS_GROWTH_KIB: u64 = 12 * 1024;
const ROUNDS: usize = 12;
const PER_ROUND: usize = 2000;

fn assert_flat(rss: &[u64]) {
    eprintln!("RSS after each round, KiB: {rss:?}");
    let warm = rss[2];
    let last = *rss.last().expect("rounds");
    assert!(
        last <= warm + RSS_GROWTH_KIB,
        "RSS grew from {warm} KiB to {last} KiB over the run: {rss:?}"
    );
}

/// The collector is down for the whole run (nothing listens on its port):
/// every result gets its output, memory stays flat, and the spans that could
/// not be sent are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn collector_down_costs_no_output_and_no_memory_and_is_counted() {
    let down = format!("http://127.0.0.1:{}", free_port());
    let nats = Nats::start();
    let etcd = Etcd::start();
    let (worker, metrics) = spawn_worker(
        &nats,
        &etcd,
        &[
            ("HANDOFF_OTEL__ENDPOINT", &down),
            ("HANDOFF_OTEL__QUEUE_SPANS", "256"),
        ],
    );
    let rss = rounds_of_traffic(&nats, (&worker, &metrics), ROUNDS, PER_ROUND).await;
    assert_flat(&rss);
    let failed = r#"handoff_otel_spans_dropped_total{reason="export_failed"}"#;
    let full = r#"handoff_otel_spans_dropped_total{reason="queue_full"}"#;
    let dropped = block_in_place(|| {
        common::poll_until_blocking(Duration::from_secs(20), || {
            metric(&metrics, failed) + metric(&metrics, full) >= (ROUNDS * PER_ROUND) as f64
        });
        metric(&metrics, failed) + metric(&metrics, full)
    });
    assert!(
        dropped >= (ROUNDS * PER_ROUND) as f64,
        "every span is counted dropped: {dropped}"
    );
    assert_eq!(metric(&metrics, "handoff_otel_spans_exported_total"), 0.0);
}

/// A collector that accepts connections and never answers: exports wait
/// their timeout, the queue fills, and spans beyond it are dropped at once,
/// counted, without holding outputs back or growing memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn collector_hung_fills_the_bounded_queue_and_drops_the_rest() {
    let hung = HungCollector::start();
    let nats = Nats::start();
    let etcd = Etcd::start();
    let (worker, metrics) = spawn_worker(
        &nats,
        &etcd,
        &[
            ("HANDOFF_OTEL__ENDPOINT", &hung.endpoint),
            ("HANDOFF_OTEL__QUEUE_SPANS", "256"),
            ("HANDOFF_OTEL__EXPORT_TIMEOUT_MS", "60000"),
        ],
    );
    let rss = rounds_of_traffic(&nats, (&worker, &metrics), ROUNDS, PER_ROUND).await;
    assert_flat(&rss);
    let full = metric(
        &metrics,
        r#"handoff_otel_spans_dropped_total{reason="queue_full"}"#,
    );
    // At most one batch in the hung export and the queue's 256 wait.
    let total = (ROUNDS * PER_ROUND) as f64;
    assert!(
        full >= total - 512.0 - 256.0 - 1.0,
        "spans beyond the queue are dropped and counted: {full} of {total}"
    );
}
