//! The ID mint service (contract 4.3) against a real nats-server.

use crate::common;

use common::Nats;
use common::messages::msgpack;
use futures::StreamExt;
use prefill_handoff::config::Config;
use prefill_handoff::decision::Rules;
use prefill_handoff::id_service::{self, IdService};
use prefill_handoff::identity::Identity;
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout, MachineId};
use prefill_handoff::metrics::Metrics;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

const IDS: &str = "llm.handoff.ids";

fn config() -> Config {
    Config::default().resolve().expect("default config")
}

async fn connect(nats: &Nats) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(10)))
        .connect(nats.url())
        .await
        .expect("connect to the test nats-server")
}

fn service(config: &Config) -> IdService {
    let rules = Rules::from_config(config).expect("rules");
    IdService::from_config(config, &rules)
}

/// Starts one service instance on its own connection, as one worker would.
async fn start(nats: &Nats, identity: Identity) -> Metrics {
    let metrics = Metrics::new();
    let service = service(&config());
    assert_eq!(service.subject, IDS);
    id_service::serve(connect(nats).await, service, identity, metrics.clone())
        .await
        .expect("serve");
    metrics
}

fn fixed(machine_id: i128) -> Identity {
    Identity::fixed(
        IdLayout::Rc22,
        DEFAULT_EPOCH_UNIX_MS,
        MachineId::new(machine_id).unwrap(),
    )
}

/// Sends one request; the decoded answer and its Content-Type.
async fn request(
    client: &async_nats::Client,
    body: Vec<u8>,
    json: bool,
) -> (Value, Option<String>) {
    let mut headers = async_nats::HeaderMap::new();
    if json {
        headers.insert("Content-Type", "application/json");
    }
    headers.insert(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    let answer = client
        .request_with_headers(IDS, headers, body.into())
        .await
        .expect("the ID service answers");
    let content_type = answer
        .headers
        .as_ref()
        .and_then(|h| h.get("Content-Type"))
        .map(|v| v.as_str().to_string());
    let trace = answer
        .headers
        .as_ref()
        .and_then(|h| h.get("traceparent"))
        .map(|v| v.as_str().to_string());
    assert_eq!(
        trace.as_deref(),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        "trace headers are copied to the answer"
    );
    let value = if json {
        serde_json::from_slice(&answer.payload).expect("a JSON answer")
    } else {
        rmp_serde::from_slice(&answer.payload).expect("a MessagePack answer")
    };
    (value, content_type)
}

/// The value of one series in a metrics exposition.
fn sample(metrics: &Metrics, series: &str) -> f64 {
    let text = metrics.encode();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} not in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_in_one_queue_group_never_hand_out_the_same_id() {
    let nats = Nats::start();
    let a = start(&nats, fixed(1)).await;
    let b = start(&nats, fixed(2)).await;
    let client = connect(&nats).await;

    let answers: Vec<Value> = futures::stream::iter(0..400u64)
        .map(|i| {
            let client = client.clone();
            async move {
                request(&client, msgpack(&json!({"count": i % 64 + 1})), false)
                    .await
                    .0
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;

    let mut ids = HashSet::new();
    let mut total = 0usize;
    let mut by_machine: HashMap<u64, usize> = HashMap::new();
    for answer in &answers {
        assert_eq!(answer["layout"], "rc22", "{answer}");
        let machine_id = answer["machine_id"].as_u64().expect("machine_id");
        *by_machine.entry(machine_id).or_default() += 1;
        for id in answer["ids"].as_array().expect("ids") {
            let id = id.as_u64().expect("an integer ID");
            let decoded = IdLayout::Rc22.decode(id).expect("a valid rc22 ID");
            assert_eq!(u64::from(decoded.machine_id), machine_id);
            ids.insert(id);
            total += 1;
        }
    }
    let want_total: u64 = (0..400u64).map(|i| i % 64 + 1).sum();
    assert_eq!(total as u64, want_total);
    assert_eq!(ids.len(), total, "every ID is distinct");
    assert!(by_machine.get(&1).is_some_and(|n| *n > 0), "{by_machine:?}");
    assert!(by_machine.get(&2).is_some_and(|n| *n > 0), "{by_machine:?}");
    assert_eq!(
        by_machine.values().sum::<usize>(),
        400,
        "each request answered once"
    );

    // Each worker's metrics count what it answered.
    for (metrics, machine) in [(&a, 1), (&b, 2)] {
        assert_eq!(
            sample(metrics, "handoff_id_requests_total{result=\"ok\"}") as usize,
            by_machine[&machine]
        );
    }
    let minted = sample(&a, "handoff_ids_minted_total{source=\"id_service\"}")
        + sample(&b, "handoff_ids_minted_total{source=\"id_service\"}");
    assert_eq!(minted as u64, want_total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_worker_answers_identity_unavailable_until_it_holds_a_slot() {
    let nats = Nats::start();
    let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    let metrics = start(&nats, identity.clone()).await;
    let client = connect(&nats).await;

    let (answer, _) = request(&client, msgpack(&json!({"count": 4})), false).await;
    assert_eq!(answer["kind"], "error", "{answer}");
    assert_eq!(answer["request_id"], Value::Null);
    assert_eq!(answer["error"]["code"], "identity_unavailable");
    assert!(answer.get("ids").is_none());
    assert_eq!(
        sample(
            &metrics,
            "handoff_id_requests_total{result=\"identity_unavailable\"}"
        ),
        1.0
    );

    identity.install(0x1234, MachineId::new(9).unwrap(), None);
    let (answer, _) = request(&client, vec![], false).await;
    assert_eq!(answer["machine_id"], 9, "{answer}");
    assert_eq!(answer["ids"].as_array().map(Vec::len), Some(1));

    identity.fence();
    let (answer, _) = request(&client, vec![], false).await;
    assert_eq!(answer["error"]["code"], "identity_unavailable", "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_and_counts_are_malformed() {
    let nats = Nats::start();
    let metrics = start(&nats, fixed(3)).await;
    let client = connect(&nats).await;
    // (name, body, JSON?)
    let cases: [(&str, Vec<u8>, bool); 8] = [
        ("count 0", msgpack(&json!({"count": 0})), false),
        ("count 1025", msgpack(&json!({"count": 1025})), false),
        ("count \"x\"", msgpack(&json!({"count": "x"})), false),
        ("count 2.5", msgpack(&json!({"count": 2.5})), false),
        ("count 2.0", msgpack(&json!({"count": 2.0})), false),
        ("JSON count 0", br#"{"count": 0}"#.to_vec(), true),
        ("JSON float", br#"{"count": 1.0}"#.to_vec(), true),
        ("not JSON", b"count=3".to_vec(), true),
    ];
    for (name, body, json) in &cases {
        let (answer, _) = request(&client, body.clone(), *json).await;
        assert_eq!(answer["kind"], "error", "{name}: {answer}");
        assert_eq!(answer["request_id"], Value::Null, "{name}");
        assert_eq!(answer["error"]["code"], "malformed", "{name}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("1..=1024"), "{name}: {message}");
    }
    assert_eq!(
        sample(&metrics, "handoff_id_requests_total{result=\"malformed\"}"),
        cases.len() as f64
    );
    assert_eq!(
        sample(&metrics, "handoff_ids_minted_total{source=\"id_service\"}"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_request_gets_a_json_answer() {
    let nats = Nats::start();
    start(&nats, fixed(700)).await;
    let client = connect(&nats).await;

    let (answer, content_type) = request(&client, br#"{"count": 5}"#.to_vec(), true).await;
    assert_eq!(content_type.as_deref(), Some("application/json"));
    assert_eq!(answer["machine_id"], 700);
    assert_eq!(answer["ids"].as_array().map(Vec::len), Some(5));

    let (answer, content_type) = request(&client, msgpack(&json!({"count": 2})), false).await;
    assert_eq!(
        content_type, None,
        "MessagePack answers carry no Content-Type"
    );
    assert_eq!(answer["ids"].as_array().map(Vec::len), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowercase_content_type_is_read_like_any_other_spelling() {
    // The ID service reads headers through the same case-insensitive lookup
    // as the pipeline: `content-type` as some clients write it names JSON too.
    let nats = Nats::start();
    start(&nats, fixed(701)).await;
    let client = connect(&nats).await;
    for spelling in ["content-type", "CONTENT-TYPE"] {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(spelling, "application/json");
        let answer = client
            .request_with_headers(IDS, headers, br#"{"count": 3}"#.to_vec().into())
            .await
            .expect("the ID service answers");
        let value: Value = serde_json::from_slice(&answer.payload)
            .unwrap_or_else(|e| panic!("{spelling}: a JSON answer: {e}"));
        assert_eq!(value["ids"].as_array().map(Vec::len), Some(3), "{spelling}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_cannot_be_answered_are_counted_and_never_published() {
    let nats = Nats::start();
    let metrics = start(&nats, fixed(4)).await;
    let client = connect(&nats).await;
    let mut gen_jobs = client.subscribe("llm.gen.jobs").await.unwrap();
    let mut system = client.subscribe("$JS.API.>").await.unwrap();
    client.flush().await.unwrap();

    client
        .publish(IDS, msgpack(&json!({"count": 1})).into())
        .await
        .unwrap();
    for reply in [
        "llm.gen.jobs",
        "$JS.API.STREAM.DELETE.X",
        "not.allowed.here",
    ] {
        client
            .publish_with_reply(IDS, reply, vec![].into())
            .await
            .unwrap();
    }
    // Published after the others on the same connection, so answered after them.
    let (answer, _) = request(&client, vec![], false).await;
    assert_eq!(answer["machine_id"], 4);

    assert_eq!(
        sample(&metrics, "handoff_id_requests_total{result=\"no_reply\"}"),
        1.0
    );
    assert_eq!(
        sample(
            &metrics,
            "handoff_id_requests_total{result=\"reply_refused\"}"
        ),
        3.0
    );
    assert_eq!(
        sample(&metrics, "handoff_id_requests_total{result=\"ok\"}"),
        1.0
    );
    assert_eq!(
        sample(&metrics, "handoff_ids_minted_total{source=\"id_service\"}"),
        1.0
    );
    // The service answered the last request after the refused ones, so
    // anything it published for them was routed here before that answer;
    // a fence sent through the server now is the next message on each.
    for (sub, subject) in [
        (&mut gen_jobs, "llm.gen.jobs"),
        (&mut system, "$JS.API.TEST.FENCE"),
    ] {
        client
            .publish(subject, "fence".into())
            .await
            .expect("publish a fence");
        let next = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("the fence comes back")
            .expect("the subscription is open");
        assert_eq!(
            &next.payload[..],
            b"fence",
            "nothing may be published to a refused reply subject: {next:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_stops_when_the_connection_drains() {
    let nats = Nats::start();
    let client = connect(&nats).await;
    let service = service(&config());
    let task = id_service::serve(client.clone(), service, fixed(5), Metrics::new())
        .await
        .unwrap();
    client.drain().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the service task ends after drain")
        .unwrap();
}
