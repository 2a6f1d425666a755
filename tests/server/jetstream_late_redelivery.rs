//! A decode job stored in GEN whose ack never reached the worker, redelivered
//! only after the GEN stream's duplicate window has passed (no worker pulled
//! meanwhile): `Nats-Msg-Id` no longer drops the second copy, so the worker
//! looks for the first one. GEN still holds one decode job for the request;
//! a late redelivery whose first handling never stored a job still gets one.

use crate::common;
use crate::common::jetstream_support;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::PullConsumer};
use common::Nats;
use futures::StreamExt;
use jetstream_support::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_a_decode_job_redelivered_after_the_duplicate_window_is_stored_once() {
    let nats = Nats::start();
    let mut config = config(&nats);
    // Shrunk windows: a redelivery span of 3 × 1 s + 0.1 s + 0.2 s makes a
    // duplicate window of 4 s.
    config.jetstream.ack_wait_secs = 1;
    config.jetstream.max_deliver = 3;
    config.jetstream.nak_delay_ms = 100;
    config.jetstream.duplicate_window_secs = 1;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = jetstream::new(client.clone());
    setup(&js, &config).await;
    let mut gen_stream = js.get_stream("LLM_GEN").await.expect("GEN");
    let window = gen_stream
        .info()
        .await
        .expect("info")
        .config
        .duplicate_window;
    assert_eq!(window, Duration::from_secs(4));

    let stored_first = needs_mint("late-stored");
    let never_stored = needs_mint("late-lost");
    publish_all(&js, &[stored_first.clone(), never_stored.clone()]).await;

    // The first handling of both, by a worker that then vanished: the first
    // one's decode job was stored (its ack to the prefill stream was lost),
    // the second one's publish never happened.
    let consumer: PullConsumer = js
        .get_stream("LLM_PREFILL")
        .await
        .expect("prefill")
        .get_consumer("handoff")
        .await
        .expect("consumer");
    let mut batch = consumer
        .fetch()
        .max_messages(2)
        .messages()
        .await
        .expect("fetch");
    let mut fetched = 0;
    while let Some(message) = batch.next().await {
        message.expect("delivery");
        fetched += 1;
    }
    assert_eq!(fetched, 2, "both delivered once, neither acked");
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", "handoff-late-stored");
    let first_copy = rmp_serde::to_vec_named(&serde_json::json!({
        "request_id": "late-stored",
        "copy": "first",
    }))
    .expect("encode");
    js.publish_with_headers(GEN, headers, first_copy.into())
        .await
        .expect("publish")
        .await
        .expect("stored");

    // No worker pulls for longer than the window.
    tokio::time::sleep(window + Duration::from_secs(2)).await;
    let worker = LibWorker::start(&config, fixed_identity(5)).await;
    assert!(
        wait_drained(&js, Duration::from_secs(30)).await,
        "{}",
        queue_state(&js).await
    );
    let in_gen = gen_stream_request_ids(&js).await;
    let count = |id: &str| in_gen.iter().filter(|r| r.as_str() == id).count();
    assert_eq!(
        count("late-stored"),
        1,
        "GEN holds one decode job: {in_gen:?}"
    );
    assert_eq!(
        count("late-lost"),
        1,
        "the lost one is published: {in_gen:?}"
    );
    worker.stop().await.expect("stop");
}
