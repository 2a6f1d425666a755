//! The least-privilege JetStream user of `config/nats/handoff-permissions.conf`
//! on the rare path: a decode job already stored in GEN whose result comes
//! back after GEN's duplicate window has passed. `Nats-Msg-Id` no longer
//! drops a second copy, so the worker reads GEN back (an ordered consumer,
//! headers only) to find the first one; with the shipped permissions that
//! read is allowed, the result is acked, and GEN holds one decode job.

use crate::common;
use crate::secure_transport::{Mode, least_privilege_server, spawn_worker};

use async_nats::jetstream::{self, consumer::PullConsumer};
use async_nats::{ConnectOptions, HeaderMap};
use common::jetstream_support::{
    GEN, gen_stream_request_ids, needs_mint, publish_all, queue_state, wait_drained,
};
use common::{Etcd, free_port};
use futures::StreamExt;
use std::time::Duration;
use tokio::task::block_in_place;

/// Redelivery windows shrunk so that GEN's duplicate window is 4 s: a
/// redelivery span of 3 × 1 s + 0.1 s + 0.2 s, rounded up (`jetstream_late_redelivery`).
const WINDOWS: [(&str, &str); 4] = [
    ("HANDOFF_JETSTREAM__ACK_WAIT_SECS", "1"),
    ("HANDOFF_JETSTREAM__MAX_DELIVER", "3"),
    ("HANDOFF_JETSTREAM__NAK_DELAY_MS", "100"),
    ("HANDOFF_JETSTREAM__DUPLICATE_WINDOW_SECS", "1"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_least_privilege_user_acks_a_late_redelivery_without_a_second_decode_job() {
    let nats = least_privilege_server(free_port());
    let etcd = Etcd::start();
    let client = ConnectOptions::with_user_and_password("test".into(), "test".into())
        .connect(nats.url())
        .await
        .expect("test client");
    let js = jetstream::new(client.clone());
    // The streams and consumer as the worker wants them (so that it checks
    // them and changes nothing).
    let mut config = prefill_handoff::config::Config::default();
    config.mode = prefill_handoff::config::Mode::Jetstream;
    config.jetstream.ack_wait_secs = 1;
    config.jetstream.max_deliver = 3;
    config.jetstream.nak_delay_ms = 100;
    config.jetstream.duplicate_window_secs = 1;
    let config = config.resolve().expect("config");
    prefill_handoff::setup::ensure(&js, &config)
        .await
        .expect("setup");
    let window = js
        .get_stream("LLM_GEN")
        .await
        .expect("GEN")
        .info()
        .await
        .expect("info")
        .config
        .duplicate_window;
    assert_eq!(window, Duration::from_secs(4));

    // The first handling, by a worker that then vanished: its decode job
    // was stored, its ack to the prefill stream never arrived.
    publish_all(&js, &[needs_mint("late-least")]).await;
    let consumer: PullConsumer = js
        .get_stream("LLM_PREFILL")
        .await
        .expect("prefill")
        .get_consumer("handoff")
        .await
        .expect("consumer");
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .messages()
        .await
        .expect("fetch");
    let first = batch.next().await.expect("one delivery").expect("delivery");
    drop(first);
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", "handoff-late-least");
    let first_copy = rmp_serde::to_vec_named(&serde_json::json!({
        "request_id": "late-least",
        "copy": "first",
    }))
    .expect("encode");
    js.publish_with_headers(GEN, headers, first_copy.into())
        .await
        .expect("publish")
        .await
        .expect("stored");

    // No worker pulls for longer than the window; then one, as the
    // least-privilege user.
    tokio::time::sleep(window + Duration::from_secs(2)).await;
    let mut env = vec![
        ("HANDOFF_NATS__USER".to_string(), "jetstream".to_string()),
        ("HANDOFF_NATS__PASSWORD".to_string(), "pw".to_string()),
    ];
    env.extend(WINDOWS.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut worker = spawn_worker(&nats, &etcd, Mode::Jetstream, &env);
    let drained = wait_drained(&js, Duration::from_secs(30)).await;
    let in_gen = gen_stream_request_ids(&js).await;
    let server_log = nats.log();
    worker.sigterm();
    let code = block_in_place(|| worker.wait_exit(Duration::from_secs(30)));
    assert!(
        !server_log.contains("Violation"),
        "the worker needed more than the shipped permissions:\n{server_log}\n{}",
        worker.log()
    );
    assert!(drained, "{}\n{}", queue_state(&js).await, worker.log());
    let copies = in_gen.iter().filter(|id| *id == "late-least").count();
    assert_eq!(copies, 1, "GEN holds one decode job: {in_gen:?}");
    assert_eq!(code, Some(0), "{}", worker.log());
}
