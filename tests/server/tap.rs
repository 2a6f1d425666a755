//! A subscriber on `>` (an operator's `nats sub '>'`, a tap) changes
//! nothing: the worker starts, answers each result once and, in JetStream
//! mode, acks each on its first delivery. Its round trips to the server
//! (`transport::round_trip`: readiness, the cancel listener, the ID
//! service, the confirmation of replies) are its own echoes, which a tap
//! sees but does not stall; a request waiting for "no responders" would
//! wait out its timeout instead.

use crate::common;
use crate::common::jetstream_support::*;

use common::worker_support::round_trip;
use common::{Etcd, Nats, Worker};
use std::time::Duration;
use tokio::task::block_in_place;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_core_worker_beside_a_tap_on_every_subject_answers_each_result_once() {
    beside_a_tap("core").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_jetstream_worker_beside_a_tap_on_every_subject_acks_each_result_once() {
    beside_a_tap("jetstream").await;
}

async fn beside_a_tap(mode: &str) {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let tap = async_nats::connect(nats.url()).await.expect("connect");
    let _everything = tap.subscribe(">").await.expect("subscribe");
    round_trip(&tap).await;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    if mode == "jetstream" {
        setup(&js, &config(&nats)).await;
    }
    let collector = Collector::start(&client).await;
    let (worker, _metrics) =
        block_in_place(|| Worker::run_ready(&nats, &etcd, mode, &["jetstream.create=false"], &[]));

    let inputs: Vec<Input> = (0..40).map(mixed).collect();
    if mode == "jetstream" {
        publish_all(&js, &inputs).await;
    } else {
        for input in &inputs {
            client
                .publish_with_headers(PREFILL, input.headers(), input.payload.clone().into())
                .await
                .expect("publish");
        }
    }
    assert!(
        collector
            .wait_for(inputs.len(), Duration::from_secs(30))
            .await,
        "{} of {} outputs:\n{}",
        collector.len(),
        inputs.len(),
        worker.log()
    );
    if mode == "jetstream" {
        assert!(
            wait_drained(&js, Duration::from_secs(30)).await,
            "{}",
            queue_state(&js).await
        );
        assert_eq!(
            deliveries(&js).await,
            inputs.len() as u64,
            "each result acked on its first delivery:\n{}",
            worker.log()
        );
    }
    collector.fence().await;
    let duplicates = check_outputs(&inputs, &collector.all());
    assert!(duplicates.is_empty(), "duplicates: {duplicates:?}");
}
