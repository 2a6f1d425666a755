//! `setup` against a real nats-server: streams and consumer created with the
//! configured settings, a second run changes nothing, editable differences
//! are updated, and differences the server cannot change are refused clearly.

use crate::common;

use async_nats::jetstream::{
    self,
    consumer::{AckPolicy, DeliverPolicy},
    stream::{RetentionPolicy, StorageType},
};
use common::Nats;
use prefill_handoff::config::Config;
use prefill_handoff::setup::JetStreamError;
use prefill_handoff::setup::{self, Change};
use std::time::Duration;

fn config(nats: &Nats) -> Config {
    let mut config = Config::default();
    config.nats.url = nats.url();
    config.jetstream.ack_wait_secs = 7;
    // A redelivery span (2 × 7 s + 1 s) inside the 120 s duplicate window:
    // the window is the configured one. (Longer spans: the test below.)
    config.jetstream.max_deliver = 2;
    config.jetstream.max_ack_pending = 300;
    config.jetstream.max_age_secs = 3600;
    config.resolve().expect("valid test config")
}

async fn context(nats: &Nats) -> jetstream::Context {
    let client = async_nats::connect(nats.url()).await.expect("connect");
    jetstream::new(client)
}

fn changes(report: &setup::Report) -> Vec<(String, Change)> {
    report.objects.clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn jetstream_setup_creates_streams_and_consumer_as_configured() {
    let nats = Nats::start();
    let js = context(&nats).await;
    let config = config(&nats);

    let report = setup::ensure(&js, &config).await.expect("setup");
    assert_eq!(
        changes(&report),
        vec![
            ("stream LLM_PREFILL".to_string(), Change::Created),
            ("stream LLM_GEN".to_string(), Change::Created),
            ("stream LLM_CANCEL".to_string(), Change::Created),
            ("consumer LLM_PREFILL/handoff".to_string(), Change::Created),
        ]
    );

    let mut prefill = js.get_stream("LLM_PREFILL").await.expect("prefill stream");
    let p = prefill.info().await.expect("info").config.clone();
    assert_eq!(p.subjects, vec!["llm.prefill.results".to_string()]);
    assert_eq!(p.retention, RetentionPolicy::WorkQueue);
    assert_eq!(p.storage, StorageType::File);
    assert_eq!(p.max_age, Duration::from_secs(3600));

    let mut gen_stream = js.get_stream("LLM_GEN").await.expect("gen stream");
    let g = gen_stream.info().await.expect("info").config.clone();
    assert_eq!(g.subjects, vec!["llm.gen.jobs".to_string()]);
    assert_eq!(g.retention, RetentionPolicy::Limits);
    assert_eq!(g.storage, StorageType::File);
    assert_eq!(g.duplicate_window, Duration::from_secs(120));
    assert_eq!(g.max_age, Duration::from_secs(3600));

    let c = prefill
        .consumer_info("handoff")
        .await
        .expect("consumer")
        .config;
    assert_eq!(c.durable_name.as_deref(), Some("handoff"));
    assert_eq!(c.ack_policy, AckPolicy::Explicit);
    assert_eq!(c.deliver_policy, DeliverPolicy::All);
    assert_eq!(c.ack_wait, Duration::from_secs(7));
    assert_eq!(c.max_deliver, 2);
    assert_eq!(c.max_ack_pending, 300);
    assert!(c.deliver_subject.is_none(), "a pull consumer");
}

#[tokio::test(flavor = "multi_thread")]
async fn jetstream_setup_twice_changes_nothing_the_second_time() {
    let nats = Nats::start();
    let js = context(&nats).await;
    let config = config(&nats);

    setup::ensure(&js, &config).await.expect("first setup");
    let before = snapshot(&js).await;
    let report = setup::ensure(&js, &config).await.expect("second setup");
    let after = snapshot(&js).await;

    assert!(
        report.objects.iter().all(|(_, c)| *c == Change::Unchanged),
        "second run reported changes:\n{report}"
    );
    assert_eq!(before, after, "configs or created timestamps changed");
}

/// Each object's full config as the server reports it, and its created time.
async fn snapshot(js: &jetstream::Context) -> Vec<String> {
    let mut out = Vec::new();
    for name in ["LLM_PREFILL", "LLM_GEN"] {
        let mut stream = js.get_stream(name).await.expect("stream");
        let info = stream.info().await.expect("info");
        out.push(format!("{name} {:?} {:?}", info.created, info.config));
    }
    let stream = js.get_stream("LLM_PREFILL").await.expect("stream");
    let info = stream.consumer_info("handoff").await.expect("consumer");
    out.push(format!("handoff {:?} {:?}", info.created, info.config));
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn jetstream_setup_updates_editable_differences_in_place() {
    let nats = Nats::start();
    let js = context(&nats).await;
    let mut config = config(&nats);
    setup::ensure(&js, &config).await.expect("first setup");

    config.jetstream.max_age_secs = 7200;
    config.jetstream.ack_wait_secs = 11;
    config.jetstream.duplicate_window_secs = 60;
    config.jetstream.max_ack_pending = 4096;
    let report = setup::ensure(&js, &config).await.expect("update");
    let fields = |object: &str| -> Vec<&'static str> {
        match &report
            .objects
            .iter()
            .find(|(n, _)| n == object)
            .expect(object)
            .1
        {
            Change::Updated(m) => m.iter().map(|m| m.field).collect(),
            other => panic!("{object}: expected an update, got {other}"),
        }
    };
    assert_eq!(fields("stream LLM_PREFILL"), vec!["max_age"]);
    assert_eq!(
        fields("stream LLM_GEN"),
        vec!["max_age", "duplicate_window"]
    );
    assert_eq!(
        fields("consumer LLM_PREFILL/handoff"),
        vec!["ack_wait", "max_ack_pending"]
    );

    let stream = js.get_stream("LLM_PREFILL").await.expect("stream");
    let c = stream
        .consumer_info("handoff")
        .await
        .expect("consumer")
        .config;
    assert_eq!(c.ack_wait, Duration::from_secs(11));
    assert_eq!(c.max_ack_pending, 4096);
    let mut gen_stream = js.get_stream("LLM_GEN").await.expect("stream");
    let g = gen_stream.info().await.expect("info").config.clone();
    assert_eq!(g.duplicate_window, Duration::from_secs(60));
    assert_eq!(g.max_age, Duration::from_secs(7200));

    let again = setup::ensure(&js, &config).await.expect("third setup");
    assert!(
        again.objects.iter().all(|(_, c)| *c == Change::Unchanged),
        "{again}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn jetstream_setup_widens_the_duplicate_window_to_the_redelivery_span() {
    let nats = Nats::start();
    let js = context(&nats).await;
    let mut config = config(&nats);
    setup::ensure(&js, &config).await.expect("first setup");
    // 9 deliveries of 7 s plus nak delays 1+2+4+8+16+32+32+32 s: 190 s.
    config.jetstream.max_deliver = 9;
    let report = setup::ensure(&js, &config).await.expect("update");
    let gen_change = &report
        .objects
        .iter()
        .find(|(n, _)| n == "stream LLM_GEN")
        .expect("GEN")
        .1;
    assert_eq!(
        gen_change.to_string(),
        "updated (duplicate_window 120s → 190s)"
    );
    let mut gen_stream = js.get_stream("LLM_GEN").await.expect("stream");
    let g = gen_stream.info().await.expect("info").config.clone();
    assert_eq!(g.duplicate_window, Duration::from_secs(190));

    config.jetstream.max_deliver = -1;
    let err = setup::ensure(&js, &config)
        .await
        .expect_err("an unbounded redelivery span cannot be covered");
    assert!(err.to_string().contains("jetstream.max_deliver"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn jetstream_setup_refuses_replicas_a_single_server_cannot_hold_and_says_why() {
    let nats = Nats::start();
    let js = context(&nats).await;
    let mut config = config(&nats);
    config.jetstream.replicas = 3;
    let err = setup::ensure(&js, &config)
        .await
        .expect_err("one server holds no R3 stream");
    let text = err.to_string();
    assert!(
        text.contains("3 replicas") && text.contains("jetstream.replicas"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn jetstream_setup_refuses_a_storage_change_and_says_why() {
    let nats = Nats::start();
    let js = context(&nats).await;
    let mut config = config(&nats);
    setup::ensure(&js, &config).await.expect("first setup");

    config.jetstream.storage = "memory".into();
    let err = setup::ensure(&js, &config)
        .await
        .expect_err("storage cannot change");
    let text = err.to_string();
    assert!(matches!(err, JetStreamError::Incompatible(_)), "{text}");
    assert!(
        text.contains("LLM_PREFILL") && text.contains("storage"),
        "{text}"
    );
    // Nothing was deleted or changed.
    let mut prefill = js.get_stream("LLM_PREFILL").await.expect("stream");
    assert_eq!(
        prefill.info().await.expect("info").config.storage,
        StorageType::File
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn jetstream_setup_memory_storage_and_custom_namespace() {
    let nats = Nats::start();
    let js = context(&nats).await;
    let mut config = Config::default();
    config.nats.url = nats.url();
    config.namespace = "tenant-a".into();
    config.jetstream.storage = "memory".into();
    let config = config.resolve().expect("config");

    let report = setup::ensure(&js, &config).await.expect("setup");
    let names: Vec<_> = report.objects.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "stream TENANT-A_PREFILL",
            "stream TENANT-A_GEN",
            "stream TENANT-A_CANCEL",
            "consumer TENANT-A_PREFILL/handoff"
        ]
    );
    let mut s = js.get_stream("TENANT-A_GEN").await.expect("stream");
    let info = s.info().await.expect("info");
    assert_eq!(info.config.storage, StorageType::Memory);
    assert_eq!(info.config.subjects, vec!["tenant-a.gen.jobs".to_string()]);
}
