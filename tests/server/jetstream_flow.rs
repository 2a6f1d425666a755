//! The durable mode at library level: workers run `serve` in the test
//! process against a real nats-server. Every published result yields exactly
//! one output, and the work queue ends empty.

use crate::common;
use crate::common::jetstream_support;

use common::Nats;
use jetstream_support::*;
use std::collections::BTreeMap;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_mixed_traffic_three_workers_each_request_once() {
    let nats = Nats::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    let collector = Collector::start(&client).await;
    setup(&js, &config).await;

    let workers = vec![
        LibWorker::start(&config, fixed_identity(1)).await,
        LibWorker::start(&config, fixed_identity(2)).await,
        LibWorker::start(&config, fixed_identity(3)).await,
    ];
    let n = 10_000;
    let inputs: Vec<Input> = (0..n).map(mixed).collect();
    let started = std::time::Instant::now();
    publish_all(&js, &inputs).await;

    assert!(
        collector.wait_for(n, Duration::from_secs(180)).await,
        "only {} of {n} outputs arrived",
        collector.len()
    );
    let elapsed = started.elapsed();
    assert!(
        wait_drained(&js, Duration::from_secs(30)).await,
        "work queue not drained"
    );
    // Anything late (a redelivery answered again) is here once the workers'
    // counters account for every delivery.
    let answered = || workers.iter().map(LibWorker::outputs_counted).sum();
    assert!(
        wait_every_delivery_answered(&js, Duration::from_secs(30), answered).await,
        "{}",
        queue_state(&js).await
    );
    collector.fence().await;
    println!(
        "{n} results through 3 workers in {:.2} s ({:.0}/s)",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64()
    );

    let counts = collector.counts();
    let mut problems = Vec::new();
    for input in &inputs {
        let got = counts
            .get(&(input.request_id.clone(), input.expect))
            .copied()
            .unwrap_or(0);
        if got != 1 {
            problems.push(format!(
                "{} {:?}: {got} outputs",
                input.request_id, input.expect
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    assert_eq!(collector.len(), n, "exactly one output per result");
    assert_eq!(prefill_left(&js).await, 0, "prefill stream empty");

    let stored = gen_stream_request_ids(&js).await;
    let expected_gen = inputs.iter().filter(|i| i.expect == Expect::Gen).count();
    assert_eq!(
        stored.len(),
        expected_gen,
        "GEN stream holds each decode job once"
    );
    let (ack_pending, redelivered, pending) = consumer_counters(&js).await;
    assert_eq!((ack_pending, pending), (0, 0));
    println!("consumer redeliveries: {redelivered}");

    for stopped in futures::future::join_all(workers.into_iter().map(LibWorker::stop)).await {
        stopped.expect("graceful stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_outputs_keep_encoding_trace_headers_and_fields() {
    let nats = Nats::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    let collector = Collector::start(&client).await;
    setup(&js, &config).await;
    let worker = LibWorker::start(&config, fixed_identity(77)).await;

    let inputs: Vec<Input> = (0..20).map(mixed).collect();
    publish_all(&js, &inputs).await;
    assert!(collector.wait_for(20, Duration::from_secs(30)).await);

    let by_id: BTreeMap<String, Seen> = collector
        .all()
        .into_iter()
        .map(|s| (s.request_id.clone(), s))
        .collect();
    for input in &inputs {
        let seen = &by_id[&input.request_id];
        assert_eq!(seen.kind, input.expect, "{}", input.request_id);
        let headers = seen.headers.as_ref().expect("outputs carry headers");
        assert!(headers.get("traceparent").is_some(), "trace header copied");
        if seen.kind == Expect::Dead {
            assert_eq!(
                seen.payload, input.payload,
                "dead letter is the original bytes"
            );
            assert!(headers.get("Handoff-Error-Code").is_some());
            assert_eq!(
                headers.get("Handoff-Source-Subject").map(|v| v.as_str()),
                Some(PREFILL)
            );
            continue;
        }
        let json = headers.get("Content-Type").map(|v| v.as_str()) == Some("application/json");
        assert_eq!(
            json, input.json,
            "{}: output encoding follows input",
            input.request_id
        );
        if seen.kind == Expect::Gen {
            assert_eq!(
                headers.get("Nats-Msg-Id").map(|v| v.as_str().to_string()),
                Some(format!("handoff-{}", input.request_id))
            );
        } else {
            let i: usize = input.request_id["req-".len()..].parse().expect("numbered");
            assert_eq!(
                seen.subject,
                format!("llm.replies.{i}"),
                "reply subject from reply_to"
            );
        }
    }
    worker.stop().await.expect("stop");
}
