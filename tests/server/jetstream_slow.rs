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
