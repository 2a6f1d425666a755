//! Slow outputs: while a decode job waits for its publish ack longer than the
//! consumer's ack wait, in-progress acks keep the message from being
//! redelivered (and its job from being sent twice).

use crate::common;
use crate::common::jetstream_support;

use common::{Nats, poll_until};
use futures::StreamExt;
use jetstream_support::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Ack subjects of the shared consumer's deliveries.
const ACKS: &str = "$JS.ACK.LLM_PREFILL.handoff.";

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
    let slow_gen = SlowGen::start(&client, &js, Duration::from_millis(2500)).await;
    let worker = LibWorker::start(&config, fixed_identity(4)).await;
    let inputs: Vec<Input> = (0..5).map(|i| mixed(10 * i + 3)).collect(); // SGLang jobs
    publish_all(&js, &inputs).await;

    assert!(
        wait_drained(&js, Duration::from_secs(30)).await,
        "{}",
        queue_state(&js).await
    );
    let requests = slow_gen.requests();
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
///
/// The worker's holdings are counted on the wire, by a client that sees
/// every delivery to the worker and every settlement it sends, in the order
/// the server relayed them. The consumer's own `num_ack_pending` is no such
/// count on nats-server 2.11 and later: the server takes acks off a queue of
/// its own, so a pull sent after an ack can be served first, and the count
/// briefly includes deliveries the worker has already acked (CI on 2.15.1
/// saw 7 while the worker held 5).
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
    let slow_gen = SlowGen::start(&client, &js, Duration::from_secs(2)).await;

    // Deliveries to the worker not yet settled, seen on the wire: each
    // delivery's reply subject is its ack subject, and a settlement other
    // than an in-progress ack ends it. One subscription keeps the server's
    // order: an ack the worker sent before its next pull arrives here before
    // any delivery that pull brought.
    let observer = async_nats::connect(nats.url()).await.expect("connect");
    let mut wire = observer.subscribe(">").await.expect("subscribe");
    // The server has the subscription before the workers publish on their
    // own connections (a flush only writes the socket).
    common::worker_support::round_trip(&observer).await;
    // (deliveries held now, the most at once)
    let held: Arc<Mutex<(BTreeSet<String>, usize)>> = Arc::default();
    {
        let held = held.clone();
        tokio::spawn(async move {
            while let Some(m) = wire.next().await {
                let mut h = held.lock().unwrap();
                match m.reply.as_deref() {
                    Some(ack) if ack.starts_with(ACKS) => {
                        h.0.insert(ack.to_string());
                        h.1 = h.1.max(h.0.len());
                    }
                    _ if m.subject.starts_with(ACKS) && &m.payload[..] != b"+WPI" => {
                        h.0.remove(m.subject.as_str());
                    }
                    _ => {}
                }
            }
        });
    }

    let worker = LibWorker::start(&config, fixed_identity(5)).await;
    publish_all(&js, &inputs).await;
    poll_until(Duration::from_secs(120), || async {
        let (ack_pending, _, pending) = consumer_counters(&js).await;
        ack_pending == 0 && pending == 0
    })
    .await;
    assert!(
        wait_drained(&js, Duration::from_secs(10)).await,
        "{}",
        queue_state(&js).await
    );

    // The last settlements may still be on their way to the observer.
    poll_until(Duration::from_secs(10), || async {
        held.lock().unwrap().0.is_empty()
    })
    .await;
    let most_outstanding = slow_gen.most_outstanding();
    let (still_held, most_held) = held.lock().unwrap().clone();
    let most = BUDGET / size;
    assert!(
        most_held <= most && most_outstanding <= most,
        "at most {most} results of {size} bytes fit in {BUDGET} bytes; the worker held \
         {most_held} deliveries unsettled and {most_outstanding} jobs unconfirmed at once"
    );
    assert!(most_outstanding >= 1 && most_held >= 1);
    assert!(still_held.is_empty(), "never settled: {still_held:?}");
    let requests = slow_gen.requests();
    assert_eq!(requests.len(), RESULTS, "{requests:?}");
    assert!(
        requests.values().all(|n| *n == 1),
        "each job sent once: {requests:?}"
    );
    assert_eq!(deliveries(&js).await, RESULTS as u64, "no redelivery");
    worker.stop().await.expect("stop");
}

/// Stands in for the GEN stream (deleted): a subscriber that acks each
/// decode job `delay` after it came, as a slow stream would, counting the
/// jobs per request ID and how many waited for their ack at once.
struct SlowGen {
    requests: Arc<Mutex<BTreeMap<String, usize>>>,
    /// (jobs not yet acked, the most at once)
    outstanding: Arc<Mutex<(usize, usize)>>,
}

impl SlowGen {
    async fn start(
        client: &async_nats::Client,
        js: &async_nats::jetstream::Context,
        delay: Duration,
    ) -> SlowGen {
        js.delete_stream("LLM_GEN").await.expect("delete GEN");
        let slow_gen = SlowGen {
            requests: Arc::default(),
            outstanding: Arc::default(),
        };
        let mut sub = client.subscribe(GEN).await.expect("subscribe");
        client.flush().await.expect("flush");
        let client = client.clone();
        let requests = slow_gen.requests.clone();
        let outstanding = slow_gen.outstanding.clone();
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
                    tokio::time::sleep(delay).await;
                    outstanding.lock().unwrap().0 -= 1;
                    if let Some(reply) = m.reply {
                        let ack = format!(r#"{{"stream":"LLM_GEN","seq":{seq}}}"#);
                        let _ = client.publish(reply, ack.into()).await;
                    }
                });
            }
        });
        slow_gen
    }

    /// Jobs received per request ID.
    fn requests(&self) -> BTreeMap<String, usize> {
        self.requests.lock().unwrap().clone()
    }

    /// The most jobs that waited for their ack at once.
    fn most_outstanding(&self) -> usize {
        self.outstanding.lock().unwrap().1
    }
}
