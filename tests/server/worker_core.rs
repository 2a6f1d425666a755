//! The worker loop in core mode against a real nats-server, with fixed
//! identities (no etcd): every result gets exactly one output, on the right
//! subject, with the contract's fields.

use crate::common;
use crate::common::worker_support;

use common::Nats;
use common::messages::{header, msgpack};
use serde_json::json;
use std::time::Duration;
use worker_support::cases::{self, Case};
use worker_support::{Collector, DEAD, GEN, InProcess, PREFILL, client, config, fixed_identity};

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_traffic_through_two_workers_gives_each_result_one_output() {
    let nats = Nats::start();
    let config = config(&nats.url());
    let a = InProcess::start(&config, fixed_identity(11)).await;
    let b = InProcess::start(&config, fixed_identity(12)).await;
    let test = client(&nats.url()).await;
    let collector = Collector::start(&test).await;

    let mut all: Vec<Case> = Vec::new();
    for round in 0..6 {
        all.extend(cases::mixed(&format!("r{round}")));
    }
    cases::publish(&test, &all).await;
    let settled = || async { a.settled().await && b.settled().await };
    let outputs = collector.wait_outputs(all.len(), WAIT, settled).await;
    let machine_ids = cases::check(&all, &outputs);

    assert!(
        machine_ids.contains(&Some(11)) && machine_ids.contains(&Some(12)),
        "both workers hand off: {machine_ids:?}"
    );
    let (ra, rb) = (a.stop().await, b.stop().await);
    assert!(
        ra.counts.received > 0 && rb.counts.received > 0,
        "both workers take part: {ra:?} {rb:?}"
    );
    assert_eq!(ra.counts.received + rb.counts.received, all.len() as u64);
    assert_eq!(ra.counts.published + rb.counts.published, all.len() as u64);
    assert_eq!(ra.counts.failed + rb.counts.failed, 0);
    assert!(ra.flushed && rb.flushed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_reply_subjects_are_dead_lettered_and_never_published_to() {
    let nats = Nats::start();
    let config = config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(3)).await;
    let test = client(&nats.url()).await;
    // A stream the first hostile reply would delete if the worker published there.
    let js = async_nats::jetstream::new(test.clone());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "X".into(),
        subjects: vec!["x.>".into()],
        ..Default::default()
    })
    .await
    .expect("create stream X");
    let collector = Collector::start(&test).await;

    let hostile = [
        "$JS.API.STREAM.DELETE.X",
        "$SYS.REQ.SERVER.PING",
        "$KV.bucket.key",
        "_INBOX.*",
        "_INBOX.>",
        ">",
        "*",
        GEN,
        DEAD,
        PREFILL,
        "llm.handoff.ids",
        "_INBOX.ok\r\nPUB llm.gen.jobs 2",
        "_INBOX..x",
    ];
    let mut bodies = Vec::new();
    for (i, reply) in hostile.iter().enumerate() {
        // Both kinds of result: one that would go to decode, one terminal.
        for finish in [json!(null), json!("eos")] {
            let body = msgpack(&json!({
                "request_id": format!("hostile-{i}"),
                "reply_to": reply,
                "frames": [{"token_ids": [1], "finish_reason": finish, "disaggregated_params": {"ctx_request_id": 1}}],
            }));
            test.publish(PREFILL, body.clone().into()).await.unwrap();
            bodies.push(body);
        }
    }
    // A hostile NATS reply subject (no reply_to in the body) is refused too.
    for reply in ["$JS.API.STREAM.DELETE.X", "$SYS.REQ.SERVER.PING", GEN] {
        let body = msgpack(&json!({"request_id": "r", "frames": [{"finish_reason": "stop"}]}));
        test.publish_with_reply(PREFILL, reply, body.clone().into())
            .await
            .unwrap();
        bodies.push(body);
    }
    test.flush().await.unwrap();

    // The server's advisory about creating stream X may reach the collector
    // after it subscribed (seen: 30 "outputs" for 29 results): not an output.
    let advisory = |m: &async_nats::Message| m.subject.starts_with("$JS.EVENT.ADVISORY.");
    let mut outputs = collector
        .wait_outputs(bodies.len(), WAIT, || worker.settled())
        .await;
    outputs.retain(|m| !advisory(m));
    for message in collector.all() {
        if advisory(&message) {
            continue; // the server's own advisory about creating stream X
        }
        assert!(
            [PREFILL, DEAD].contains(&message.subject.as_str()),
            "the worker published on {:?}",
            message.subject
        );
    }
    assert_eq!(
        outputs.len(),
        bodies.len(),
        "one dead letter per hostile result"
    );
    let mut expected = bodies.clone();
    for message in &outputs {
        let i = expected
            .iter()
            .position(|b| b.as_slice() == message.payload.as_ref())
            .expect("a dead letter holds the original bytes of one hostile result");
        expected.swap_remove(i);
        let code = header(message.headers.as_ref(), "Handoff-Error-Code");
        assert!(
            matches!(code, Some("reply_to_not_allowed") | Some("malformed")),
            "{code:?}"
        );
    }
    js.get_stream("X").await.expect("stream X still exists");
    let report = worker.stop().await;
    assert_eq!(report.counts.published, bodies.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_headers_are_copied_and_json_in_gives_json_out() {
    let nats = Nats::start();
    let config = config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(5)).await;
    let test = client(&nats.url()).await;
    let collector = Collector::start(&test).await;

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let tracestate = "rojo=00f067aa0ba902b7";
    let inputs = [
        (
            "decode",
            json!({"request_id": "j1", "reply_to": "llm.replies.j1", "frames": [{"finish_reason": null, "disaggregated_params": {"ctx_request_id": 9}}]}),
        ),
        (
            "terminal",
            json!({"request_id": "j2", "reply_to": "llm.replies.j2", "frames": [{"finish_reason": "stop", "text": "ok"}]}),
        ),
        (
            "error",
            json!({"request_id": "j3", "reply_to": "llm.replies.j3", "frames": []}),
        ),
        (
            "dead_letter",
            json!({"request_id": "j4", "reply_to": "nowhere", "frames": []}),
        ),
    ];
    for (_, body) in &inputs {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Content-Type", "application/json");
        headers.insert("traceparent", traceparent);
        headers.insert("tracestate", tracestate);
        headers.insert("X-Not-Copied", "1");
        let payload = serde_json::to_vec(body).unwrap();
        test.publish_with_headers(PREFILL, headers, payload.into())
            .await
            .unwrap();
    }
    // MessagePack with a trace header: the output stays MessagePack.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("traceparent", traceparent);
    let body = json!({"request_id": "m1", "reply_to": "llm.replies.m1", "frames": [{"finish_reason": "eos"}]});
    test.publish_with_headers(PREFILL, headers, msgpack(&body).into())
        .await
        .unwrap();
    test.flush().await.unwrap();

    let outputs = collector.wait_outputs(5, WAIT, || worker.settled()).await;
    assert_eq!(outputs.len(), 5);
    for message in &outputs {
        let headers = message.headers.as_ref();
        assert_eq!(
            header(headers, "traceparent"),
            Some(traceparent),
            "{}",
            message.subject
        );
        assert!(header(headers, "X-Not-Copied").is_none());
        match message.subject.as_str() {
            "llm.replies.m1" => {
                assert_eq!(header(headers, "Content-Type"), None);
                let out: serde_json::Value = rmp_serde::from_slice(&message.payload).unwrap();
                assert_eq!(out["kind"], "terminal");
            }
            DEAD => {
                assert_eq!(header(headers, "tracestate"), Some(tracestate));
                let original = serde_json::to_vec(&inputs[3].1).unwrap();
                assert_eq!(message.payload.as_ref(), original.as_slice());
            }
            subject => {
                assert_eq!(header(headers, "tracestate"), Some(tracestate));
                assert_eq!(
                    header(headers, "Content-Type"),
                    Some("application/json"),
                    "{subject}"
                );
                let out: serde_json::Value = serde_json::from_slice(&message.payload)
                    .unwrap_or_else(|e| panic!("{subject}: JSON out: {e}"));
                let expected = match subject {
                    GEN => "decode",
                    "llm.replies.j2" => "terminal",
                    "llm.replies.j3" => "error",
                    other => panic!("unexpected subject {other}"),
                };
                if expected == "decode" {
                    assert_eq!(out["backend"], "trtllm");
                    assert!(out["disagg_request_id"].as_u64().is_some());
                } else {
                    assert_eq!(out["kind"], expected, "{subject}");
                }
            }
        }
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_worker_refuses_to_mint_but_hands_off_kept_ids() {
    let nats = Nats::start();
    let config = config(&nats.url());
    // Never given a slot: fenced from the start.
    let fenced = prefill_handoff::identity::Identity::new(
        prefill_handoff::ids::IdLayout::Rc22,
        prefill_handoff::ids::DEFAULT_EPOCH_UNIX_MS,
    );
    let worker = InProcess::start(&config, fenced).await;
    let test = client(&nats.url()).await;
    let collector = Collector::start(&test).await;

    let needs_id = json!({"request_id": "f1", "reply_to": "llm.replies.f1",
        "frames": [{"disaggregated_params": {"ctx_request_id": 3, "request_type": "context_only"}}]});
    let has_id = json!({"request_id": "f2", "reply_to": "llm.replies.f2",
        "frames": [{"disaggregated_params": {"ctx_request_id": 3, "disagg_request_id": 99}}]});
    let terminal = json!({"request_id": "f3", "reply_to": "llm.replies.f3", "frames": [{"finish_reason": "eos"}]});
    for body in [&needs_id, &has_id, &terminal] {
        test.publish(PREFILL, msgpack(body).into()).await.unwrap();
    }
    test.flush().await.unwrap();

    // Three answers, and the KV release notice of the refused handoff.
    let outputs = collector.wait_outputs(4, WAIT, || worker.settled()).await;
    assert_eq!(outputs.len(), 4);
    for message in &outputs {
        let out: serde_json::Value = rmp_serde::from_slice(&message.payload).unwrap();
        match message.subject.as_str() {
            "llm.replies.f1" => {
                assert_eq!(out["kind"], "error");
                assert_eq!(out["error"]["code"], "identity_unavailable");
            }
            "llm.kv.release" => {
                assert_eq!(out["request_id"], "f1");
                assert_eq!(out["reason"], "identity_unavailable");
            }
            GEN => {
                assert_eq!(out["request_id"], "f2");
                assert_eq!(out["disagg_request_id"], 99);
                assert!(out["worker"]["machine_id"].is_null(), "no slot held: {out}");
            }
            "llm.replies.f3" => assert_eq!(out["kind"], "terminal"),
            other => panic!("unexpected subject {other}"),
        }
    }
    worker.stop().await;
}

/// Issue 9: a `tracestate` beyond the W3C sizes is not copied, so it cannot
/// push the output over the server's `max_payload`: the result still gets its
/// decode job (with the well-formed `traceparent`), and the drop is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_tracestate_is_dropped_and_counted_and_the_result_gets_its_output() {
    let max = 16 * 1024;
    let nats = Nats::start_with_max_payload(Some(max));
    let config = config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(6)).await;
    let test = client(&nats.url()).await;
    let collector = Collector::start(&test).await;

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let body = json!({"request_id": "ts", "reply_to": "llm.replies.ts",
        "frames": [{"finish_reason": null, "disaggregated_params": {"ctx_request_id": 3}}]});
    let payload = msgpack(&body);
    // A tracestate of 250-character members, far beyond 512 bytes and 32
    // members, that fills the input up to 100 bytes short of max_payload
    // (the header block adds 96 bytes besides the tracestate's value). The
    // decode job is larger than the input, so with it copied the job would
    // not fit.
    let target = max - payload.len() - 96 - 100;
    let mut tracestate = String::new();
    while tracestate.len() + 300 < target {
        let i = tracestate.len();
        tracestate.push_str(&format!("k{i}={},", "v".repeat(250)));
    }
    let last = "last=";
    let rest = target - tracestate.len() - last.len();
    tracestate.push_str(&format!("{last}{}", "v".repeat(rest)));
    assert_eq!(tracestate.len(), target);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("traceparent", traceparent);
    headers.insert("tracestate", tracestate.as_str());
    test.publish_with_headers(PREFILL, headers, payload.into())
        .await
        .expect("the input fits the server");
    test.flush().await.unwrap();

    let outputs = collector.wait_outputs(1, WAIT, || worker.settled()).await;
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].subject.as_str(), GEN, "a decode job");
    let headers = outputs[0].headers.as_ref();
    assert_eq!(header(headers, "traceparent"), Some(traceparent));
    assert_eq!(header(headers, "tracestate"), None);
    let samples = common::prometheus_samples(&worker.metrics.encode());
    assert_eq!(
        samples.get("handoff_trace_headers_dropped_total{header=\"tracestate\"}"),
        Some(&1.0)
    );
    assert_eq!(
        samples.get("handoff_trace_headers_dropped_total{header=\"traceparent\"}"),
        Some(&0.0)
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_larger_than_the_server_accepts_dead_letters_the_input() {
    let max = 16 * 1024;
    let nats = Nats::start_with_max_payload(Some(max));
    let config = config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(4)).await;
    let test = client(&nats.url()).await;
    let collector = Collector::start(&test).await;

    // The input fits, and so does a dead letter of it (input plus ~240 bytes
    // of headers); the decode job (input plus a 264-byte Nats-Msg-Id and the
    // worker's fields, ~430 bytes) does not.
    let request_id = "b".repeat(256);
    let mut body = json!({"request_id": request_id, "reply_to": "llm.replies.big",
        "frames": [{"disaggregated_params": {"ctx_request_id": 3, "opaque_state": ""}}]});
    let room = max - msgpack(&body).len() - 330;
    body["frames"][0]["disaggregated_params"]["opaque_state"] = json!("s".repeat(room));
    let payload = msgpack(&body);
    assert!(payload.len() < max);
    test.publish(PREFILL, payload.clone().into()).await.unwrap();
    test.flush().await.unwrap();

    let outputs = collector.wait_outputs(1, WAIT, || worker.settled()).await;
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].subject.as_str(), DEAD);
    assert_eq!(
        header(outputs[0].headers.as_ref(), "Handoff-Error-Code"),
        Some("too_large")
    );
    assert_eq!(outputs[0].payload.as_ref(), payload.as_slice());
    let report = worker.stop().await;
    assert_eq!((report.counts.published, report.counts.failed), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_too_large_to_dead_letter_whole_is_dead_lettered_without_its_bytes() {
    let max = 16 * 1024;
    let nats = Nats::start_with_max_payload(Some(max));
    let config = config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(5)).await;
    let test = client(&nats.url()).await;
    let collector = Collector::start(&test).await;

    // Each input is 60 bytes short of max_payload: it fits, but neither its
    // output nor a dead letter of it (its bytes plus ~240 bytes of headers)
    // does. One needs a decode job; the other is a dead letter by decision
    // (a reply subject the worker refuses).
    let sized = |mut body: serde_json::Value, pad: &str| {
        body[pad] = json!("");
        // The string's length prefix grows with it (str8 -> str16): 2 bytes.
        let room = max - 60 - msgpack(&body).len() - 2;
        body[pad] = json!("p".repeat(room));
        let payload = msgpack(&body);
        assert_eq!(payload.len(), max - 60);
        payload
    };
    let handoff = sized(
        json!({"request_id": "big-handoff", "reply_to": "llm.replies.big",
            "frames": [{"disaggregated_params": {"ctx_request_id": 3, "opaque_state": ""}}]}),
        "padding",
    );
    let refused = sized(
        json!({"request_id": "big-refused", "reply_to": "$JS.API.STREAM.DELETE.X",
            "frames": [{"finish_reason": "eos"}]}),
        "padding",
    );
    for payload in [&handoff, &refused] {
        test.publish(PREFILL, payload.clone().into()).await.unwrap();
    }
    test.flush().await.unwrap();

    let outputs = collector.wait_outputs(2, WAIT, || worker.settled()).await;
    assert_eq!(outputs.len(), 2, "one output each: {outputs:?}");
    for out in &outputs {
        assert_eq!(out.subject.as_str(), DEAD);
        assert_eq!(
            header(out.headers.as_ref(), "Handoff-Error-Code"),
            Some("too_large")
        );
        assert_eq!(
            header(
                out.headers.as_ref(),
                prefill_handoff::headers::names::HANDOFF_PAYLOAD_OMITTED
            ),
            Some((max - 60).to_string().as_str())
        );
        assert!(out.payload.is_empty(), "the bytes are left out");
        assert_eq!(
            header(out.headers.as_ref(), "Handoff-Source-Subject"),
            Some(PREFILL)
        );
    }
    let report = worker.stop().await;
    assert_eq!((report.counts.published, report.counts.failed), (2, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_reconnects_after_nats_restarts() {
    let mut nats = Nats::start();
    let config = config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(6)).await;
    let body = |id: &str| {
        msgpack(
            &json!({"request_id": id, "reply_to": format!("llm.replies.{id}"), "frames": [{"finish_reason": "eos"}]}),
        )
    };
    {
        let test = client(&nats.url()).await;
        let collector = Collector::start(&test).await;
        test.publish(PREFILL, body("before").into()).await.unwrap();
        test.flush().await.unwrap();
        assert_eq!(
            collector
                .wait_outputs(1, WAIT, || worker.settled())
                .await
                .len(),
            1
        );
    }

    nats.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    nats.restart();

    // Core NATS loses what is published before the worker resubscribes, so
    // keep asking until one request is answered (on the NATS reply subject:
    // the body has no reply_to).
    let test = client(&nats.url()).await;
    let mut answered = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut attempt = 0;
    while !answered && std::time::Instant::now() < deadline {
        attempt += 1;
        let body = msgpack(
            &json!({"request_id": format!("after-{attempt}"), "frames": [{"finish_reason": "eos"}]}),
        );
        let request = test.request(PREFILL, body.into());
        match tokio::time::timeout(Duration::from_millis(500), request).await {
            Ok(Ok(reply)) => {
                let out: serde_json::Value = rmp_serde::from_slice(&reply.payload).unwrap();
                assert_eq!(out["kind"], "terminal");
                assert_eq!(out["request_id"], format!("after-{attempt}"));
                answered = true;
            }
            // No responders yet (the worker has not resubscribed) or no answer.
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(answered, "the worker processed nothing after the restart");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_every_accepted_result() {
    let nats = Nats::start();
    let mut config = config(&nats.url());
    config.max_in_flight = 4;
    let worker = InProcess::start(&config, fixed_identity(8)).await;
    let test = client(&nats.url()).await;
    let collector = Collector::start(&test).await;

    // A burst the server has already routed to the worker when it is told to stop.
    let burst: Vec<Case> = (0..40)
        .flat_map(|i| cases::mixed(&format!("s{i}")))
        .collect();
    cases::publish(&test, &burst).await;
    worker_support::round_trip(&test).await;
    let report = worker.stop().await;

    // Everything the server routed before the stop is taken and answered.
    assert_eq!(
        report.counts.received,
        burst.len() as u64,
        "every routed result was accepted"
    );
    assert_eq!(report.counts.published, report.counts.received);
    assert_eq!(report.unfinished, 0);
    assert!(report.flushed);
    // The worker has stopped: nothing more is coming.
    let outputs = collector
        .wait_outputs(burst.len(), WAIT, || async { true })
        .await;
    cases::check(&burst, &outputs);
    // After the drain the worker takes nothing more: the late result is
    // routed (the collector sees it behind its fence) and goes unanswered.
    let late = msgpack(
        &json!({"request_id": "late", "reply_to": "llm.replies.late", "frames": [{"finish_reason": "eos"}]}),
    );
    test.publish(PREFILL, late.clone().into()).await.unwrap();
    collector.fence().await;
    assert!(
        collector
            .all()
            .iter()
            .any(|m| m.subject.as_str() == PREFILL && m.payload[..] == late[..]),
        "the late result reached the server"
    );
    assert_eq!(collector.outputs().len(), burst.len());
}
