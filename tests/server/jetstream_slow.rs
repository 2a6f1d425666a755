//! Slow outputs: while a decode job waits for its publish ack longer than the
//! consumer's ack wait, in-progress acks keep the message from being
//! redelivered (and its job from being sent twice).

use crate::common;
use crate::common::jetstream_support;

use common::Nats;
use futures::StreamExt;
use jetstream_support::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_slow_publish_ack_sends_progress_instead_of_timing_out() {
    let nats = Nats::start();
    let mut config = config(&nats);
    config.jetstream.ack_wait_secs = 1;
    config.jetstream.create = false;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    // Instead of the GEN stream, a responder that acks each job after 2.5 s:
    // two and a half ack waits.
    js.delete_stream("LLM_GEN").await.expect("delete GEN");
    let requests: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let mut sub = client.subscribe(GEN).await.expect("subscribe");
    client.flush().await.expect("flush");
    {
        let client = client.clone();
        let requests = requests.clone();
        tokio::spawn(async move {
            let mut seq = 0u64;
            while let Some(m) = sub.next().await {
                seq += 1;
                let id = request_id_of(&m.payload, m.headers.as_ref());
                *requests.lock().unwrap().entry(id).or_insert(0) += 1;
                let client = client.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(2500)).await;
                    if let Some(reply) = m.reply {
                        let ack = format!(r#"{{"stream":"LLM_GEN","seq":{seq}}}"#);
                        let _ = client.publish(reply, ack.into()).await;
                    }
                });
            }
        });
    }
    let worker = LibWorker::start(&config, fixed_identity(4)).await;
    let inputs: Vec<Input> = (0..5).map(|i| mixed(10 * i + 3)).collect(); // SGLang jobs
    publish_all(&js, &inputs).await;

    assert!(
        wait_drained(&js, Duration::from_secs(30)).await,
        "{}",
        queue_state(&js).await
    );
    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 5, "{requests:?}");
    assert!(
        requests.values().all(|n| *n == 1),
        "each job sent once: {requests:?}"
    );
    assert_eq!(deliveries(&js).await, 5, "no message was redelivered");
    worker.stop().await.expect("stop");
}

/// Each pull asks for at most the bytes free in the worker's budget
/// (`max_bytes`, `max_in_flight_bytes`): with large stored results and slow
/// outputs, the worker never holds more than its budget of unsettled
/// deliveries, though its count limits (`max_in_flight` 64, `jetstream.batch`
/// 32) would let it take six times as many, and it still answers every
/// result once. Measured: 5 at most (5 × 200 KB fit in 1 MiB); a pull
/// without `max_bytes` took all 30 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_pulls_never_hold_more_than_the_byte_budget() {
    const BUDGET: usize = 1024 * 1024;
    const RESULTS: usize = 30;
    let nats = Nats::start();
    let mut config = config(&nats);
    config.max_payload_bytes = 256 * 1024;
    config.max_in_flight_bytes = BUDGET;
    config.jetstream.create = false;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;

    // 200 KB results that each become a decode job of about the same size.
    let inputs: Vec<Input> = (0..RESULTS)
        .map(|i| {
            let request_id = format!("big-{i:03}");
            let value = serde_json::json!({
                "request_id": request_id,
                "reply_to": format!("llm.replies.{i}"),
                "frames": [{
                    "token_ids": [42],
                    "text": "x".repeat(200_000),
                    "finish_reason": null,
                    "disaggregated_params": {
                        "bootstrap_host": "h", "bootstrap_port": 8998, "bootstrap_room": i
                    },
                }],
            });
            Input {
                payload: rmp_serde::to_vec_named(&value).expect("msgpack"),
                request_id,
                json: false,
                expect: Expect::Gen,
            }
        })
        .collect();
    let size = inputs[0].payload.len();
    assert!(size > 200_000 && size < config.max_payload_bytes);

    // Instead of the GEN stream, a responder that acks each job 2 s after it
    // came: until then the worker holds the result it came from, unsettled.
    js.delete_stream("LLM_GEN").await.expect("delete GEN");
    let requests: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    // (jobs not yet acked, the most at once)
    let outstanding: Arc<Mutex<(usize, usize)>> = Arc::default();
    let mut sub = client.subscribe(GEN).await.expect("subscribe");
    client.flush().await.expect("flush");
    {
        let client = client.clone();
        let requests = requests.clone();
        let outstanding = outstanding.clone();
        tokio::spawn(async move {
            let mut seq = 0u64;
            while let Some(m) = sub.next().await {
                seq += 1;
                let id = request_id_of(&m.payload, m.headers.as_ref());
                *requests.lock().unwrap().entry(id).or_insert(0) += 1;
                {
                    let mut o = outstanding.lock().unwrap();
                    o.0 += 1;
                    o.1 = o.1.max(o.0);
                }
                let client = client.clone();
                let outstanding = outstanding.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    outstanding.lock().unwrap().0 -= 1;
                    if let Some(reply) = m.reply {
                        let ack = format!(r#"{{"stream":"LLM_GEN","seq":{seq}}}"#);
                        let _ = client.publish(reply, ack.into()).await;
                    }
                });
            }
        });
    }

    let worker = LibWorker::start(&config, fixed_identity(5)).await;
    publish_all(&js, &inputs).await;
    // The consumer's own count of unsettled deliveries, sampled until done.
    let mut most_ack_pending = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (ack_pending, _, pending) = consumer_counters(&js).await;
        most_ack_pending = most_ack_pending.max(ack_pending);
        if (ack_pending == 0 && pending == 0) || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        wait_drained(&js, Duration::from_secs(10)).await,
        "{}",
        queue_state(&js).await
    );

    let most_outstanding = outstanding.lock().unwrap().1;
    let most = BUDGET / size;
    assert!(
        most_ack_pending <= most && most_outstanding <= most,
        "at most {most} results of {size} bytes fit in {BUDGET} bytes; the consumer had \
         {most_ack_pending} deliveries unacked and the worker {most_outstanding} jobs \
         unconfirmed at once"
    );
    assert!(most_outstanding >= 1 && most_ack_pending >= 1);
    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), RESULTS, "{requests:?}");
    assert!(
        requests.values().all(|n| *n == 1),
        "each job sent once: {requests:?}"
    );
    assert_eq!(deliveries(&js).await, RESULTS as u64, "no redelivery");
    worker.stop().await.expect("stop");
}
