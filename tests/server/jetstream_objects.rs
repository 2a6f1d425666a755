//! JetStream objects deleted under running workers (issue 40): the durable
//! consumer, then the prefill stream. With `jetstream.create` the workers
//! recreate them and go on; without it they say what is missing, turn not
//! ready, and resume once an operator runs `setup`. Results still stored are
//! not lost either way.

use crate::common;
use crate::common::jetstream_support::*;

use async_nats::jetstream;
use common::{Etcd, Nats, Worker, http_get, poll_until};
use std::time::Duration;
use tokio::task::block_in_place;

const STREAM: &str = "LLM_PREFILL";
const CONSUMER: &str = "handoff";

/// Waits until the prefill stream and its consumer exist again.
async fn wait_recreated(js: &jetstream::Context, timeout: Duration) -> bool {
    poll_until(timeout, || async {
        match js.get_stream(STREAM).await {
            Ok(stream) => stream.consumer_info(CONSUMER).await.is_ok(),
            Err(_) => false,
        }
    })
    .await
}

fn batch(from: usize, n: usize) -> Vec<Input> {
    (from..from + n).map(mixed).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_workers_recreate_a_deleted_consumer_and_stream() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = jetstream::new(client.clone());
    setup(&js, &config).await;
    capture_outputs(&js).await;
    let settings = ["jetstream.create=true", "jetstream.ack_wait_secs=2"];
    let workers: Vec<(Worker, String)> = (0..2)
        .map(|_| block_in_place(|| Worker::run_ready(&nats, &etcd, "jetstream", &settings, &[])))
        .collect();

    let mut inputs = batch(0, 100);
    publish_all(&js, &inputs).await;
    assert!(wait_drained(&js, Duration::from_secs(30)).await);

    // The consumer deleted: results published meanwhile stay stored, and
    // the workers' recreated consumer delivers them.
    let stream = js.get_stream(STREAM).await.expect("prefill stream");
    stream
        .delete_consumer(CONSUMER)
        .await
        .expect("delete consumer");
    let more = batch(100, 100);
    publish_all(&js, &more).await;
    inputs.extend(more);
    assert!(
        wait_recreated(&js, Duration::from_secs(30)).await,
        "the consumer is back"
    );
    assert!(
        wait_drained(&js, Duration::from_secs(60)).await,
        "results stored while the consumer was gone are handled: {}",
        queue_state(&js).await
    );

    // The stream deleted (its stored results with it, by the operator's
    // hand): the workers recreate it and its consumer, and new results flow.
    js.delete_stream(STREAM)
        .await
        .expect("delete prefill stream");
    assert!(
        wait_recreated(&js, Duration::from_secs(30)).await,
        "the stream and consumer are back"
    );
    let last = batch(200, 100);
    publish_all(&js, &last).await;
    inputs.extend(last);
    assert!(
        wait_drained(&js, Duration::from_secs(60)).await,
        "results published into the recreated stream are handled: {}",
        queue_state(&js).await
    );
    check_stored(&js, &inputs, None, "after the objects came back").await;
    for (worker, metrics) in &workers {
        assert_eq!(
            http_get(metrics, "/readyz").status,
            200,
            "ready again:\n{}",
            worker.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_workers_without_create_turn_unready_until_setup_runs() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = jetstream::new(client.clone());
    setup(&js, &config).await;
    capture_outputs(&js).await;
    let settings = ["jetstream.create=false", "jetstream.ack_wait_secs=2"];
    let (worker, metrics) =
        block_in_place(|| Worker::run_ready(&nats, &etcd, "jetstream", &settings, &[]));
    let unready = |what: &str| {
        let turned = block_in_place(|| {
            common::poll_until_blocking(Duration::from_secs(30), || {
                let reply = http_get(&metrics, "/readyz");
                reply.status == 503 && reply.body.contains("consuming")
            })
        });
        assert!(turned, "not ready once {what}:\n{}", worker.log());
    };
    let ready_again = |what: &str| {
        let back = block_in_place(|| {
            common::poll_until_blocking(Duration::from_secs(30), || {
                http_get(&metrics, "/readyz").status == 200
            })
        });
        assert!(back, "ready again after {what}:\n{}", worker.log());
    };

    let mut inputs = batch(0, 50);
    publish_all(&js, &inputs).await;
    assert!(wait_drained(&js, Duration::from_secs(30)).await);

    let stream = js.get_stream(STREAM).await.expect("prefill stream");
    stream
        .delete_consumer(CONSUMER)
        .await
        .expect("delete consumer");
    let more = batch(50, 50);
    publish_all(&js, &more).await;
    inputs.extend(more);
    unready("the consumer is deleted");
    assert!(
        worker.wait_for_log(
            "consumer LLM_PREFILL/handoff does not exist",
            Duration::from_secs(10)
        ),
        "the log names what is missing:\n{}",
        worker.log()
    );
    assert_eq!(prefill_left(&js).await, 50, "stored results wait");
    setup(&js, &config).await;
    ready_again("setup recreated the consumer");
    assert!(
        wait_drained(&js, Duration::from_secs(60)).await,
        "results stored while the consumer was gone are handled: {}",
        queue_state(&js).await
    );

    js.delete_stream(STREAM)
        .await
        .expect("delete prefill stream");
    unready("the stream is deleted");
    assert!(
        worker.wait_for_log("stream LLM_PREFILL does not exist", Duration::from_secs(10)),
        "the log names what is missing:\n{}",
        worker.log()
    );
    setup(&js, &config).await;
    ready_again("setup recreated the stream");
    let last = batch(100, 50);
    publish_all(&js, &last).await;
    inputs.extend(last);
    assert!(
        wait_drained(&js, Duration::from_secs(60)).await,
        "results published into the recreated stream are handled: {}",
        queue_state(&js).await
    );
    check_stored(&js, &inputs, None, "after the objects came back").await;
}
