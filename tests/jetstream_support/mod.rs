//! Shared pieces of the durable-mode tests: a test configuration, workers run
//! in the test process (library level), a mixed traffic generator, and a
//! collector that attributes every output to its request ID.

#![allow(dead_code)]

use crate::common::Nats;
use async_nats::jetstream::{self, consumer::DeliverPolicy, stream::Stream};
use async_nats::{Client, HeaderMap};
use futures::StreamExt;
use prefill_handoff::config::Config;
use prefill_handoff::identity::Identity;
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout, MachineId};
use prefill_handoff::metrics::Metrics;
use prefill_handoff::transport::jetstream::{self as durable, JetStreamError};
use prefill_handoff::wire::{self, Encoding};
use serde_json::{Value as Json, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const GEN: &str = "llm.gen.jobs";
pub const DEAD: &str = "llm.handoff.dead";
pub const PREFILL: &str = "llm.prefill.results";

/// Short ack wait and nak delay keep redelivery tests fast.
pub fn config(nats: &Nats) -> Config {
    let mut config = Config::default();
    config.nats.url = nats.url();
    config.mode = prefill_handoff::config::Mode::Jetstream;
    config.jetstream.ack_wait_secs = 2;
    config.jetstream.nak_delay_ms = 100;
    config.jetstream.max_deliver = 100;
    config.jetstream.storage = "file".into();
    config.max_in_flight = 64;
    config.jetstream.batch = 32;
    config.shutdown_timeout_secs = 5;
    config.resolve().expect("valid test config")
}

pub fn fixed_identity(machine_id: u16) -> Identity {
    Identity::fixed(
        IdLayout::Rc22,
        DEFAULT_EPOCH_UNIX_MS,
        MachineId::new(machine_id.into()).expect("machine id"),
    )
}

/// A worker running `serve` in this process, on its own connection.
pub struct LibWorker {
    task: Option<JoinHandle<Result<(), JetStreamError>>>,
    stop: Option<oneshot::Sender<()>>,
}

impl LibWorker {
    pub async fn start(config: &Config, identity: Identity) -> LibWorker {
        init_logging();
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(&config.nats.url)
            .await
            .expect("worker connects");
        let (stop, stopped) = oneshot::channel::<()>();
        let config = config.clone();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            durable::serve(client, &config, identity, Metrics::new(), None, shutdown).await
        });
        LibWorker {
            task: Some(task),
            stop: Some(stop),
        }
    }

    /// Graceful stop: no new pulls, in-flight messages finished.
    pub async fn stop(mut self) -> Result<(), JetStreamError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().expect("running");
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("worker stops within 30 s")
            .expect("worker task did not panic")
    }

    /// Like a crash: the task and everything it holds are dropped at once,
    /// unacked messages stay unacked.
    pub fn crash(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for LibWorker {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Worker logs go to the test's output, filtered by `RUST_LOG` (default: warnings).
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// Where an input's one output must go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Expect {
    Gen,
    Reply,
    Dead,
}

/// One prefill result to publish.
#[derive(Debug, Clone)]
pub struct Input {
    pub request_id: String,
    pub payload: Vec<u8>,
    pub json: bool,
    pub expect: Expect,
}

/// Poison: starts with 0xc1, a byte MessagePack never uses, and is not JSON.
pub fn poison(request_id: &str) -> Vec<u8> {
    let mut bytes = vec![0xc1, 0x00];
    bytes.extend_from_slice(format!("poison:{request_id}").as_bytes());
    bytes
}

fn encode(value: &Json, json: bool) -> Vec<u8> {
    let bytes = serde_json::to_vec(value).expect("json");
    if json {
        return bytes;
    }
    let tree = wire::decode(&bytes, Encoding::Json).expect("valid json");
    wire::encode(&tree, Encoding::MsgPack)
}

fn frame(finish_reason: Json, params: Option<Json>) -> Json {
    let mut frame = json!({"token_ids": [42], "text": "x", "finish_reason": finish_reason});
    if let Some(p) = params {
        frame["disaggregated_params"] = p;
    }
    frame
}

/// Input number `i` of a mixed run: every backend, terminal results, error
/// results, and dead letters (hostile reply subjects, poison bytes).
pub fn mixed(i: usize) -> Input {
    let request_id = format!("req-{i:06}");
    let reply_to = format!("llm.replies.{i}");
    let json = i.is_multiple_of(7);
    let result =
        |frames: Json| json!({"request_id": request_id, "reply_to": reply_to, "frames": frames});
    let (value, expect) = match i % 10 {
        0 | 1 => (
            result(json!([frame(
                Json::Null,
                Some(json!({"ctx_request_id": i, "request_type": "context_only"}))
            )])),
            Expect::Gen,
        ),
        2 => (
            result(json!([frame(
                json!("length"),
                Some(
                    json!({"ctx_request_id": i, "disagg_request_id": 1_099_511_627_776u64 + i as u64})
                )
            )])),
            Expect::Gen,
        ),
        3 => (
            result(json!([frame(
                Json::Null,
                Some(json!({"bootstrap_host": "h", "bootstrap_port": 8998, "bootstrap_room": i}))
            )])),
            Expect::Gen,
        ),
        4 => (
            result(json!([frame(
                Json::Null,
                Some(json!({"remote_engine_id": "e", "remote_block_ids": [1, 2]}))
            )])),
            Expect::Gen,
        ),
        5 => (result(json!([frame(json!("eos"), None)])), Expect::Reply),
        6 => (
            result(json!([
                frame(json!("stop"), None),
                frame(json!("length"), None)
            ])),
            Expect::Reply,
        ),
        7 => (
            result(json!([frame(
                Json::Null,
                Some(json!({"request_type": "context_only"}))
            )])),
            Expect::Reply,
        ),
        8 => (
            result(json!([{"error": "CUDA out of memory"}])),
            Expect::Reply,
        ),
        _ => {
            if i % 20 == 9 {
                return Input {
                    payload: poison(&request_id),
                    request_id,
                    json: false,
                    expect: Expect::Dead,
                };
            }
            (
                json!({"request_id": request_id, "reply_to": "$JS.API.STREAM.DELETE.LLM_GEN", "frames": [frame(json!("eos"), None)]}),
                Expect::Dead,
            )
        }
    };
    Input {
        payload: encode(&value, json),
        request_id,
        json,
        expect,
    }
}

/// A TensorRT-LLM result that needs a freshly minted `disagg_request_id`.
pub fn needs_mint(request_id: &str) -> Input {
    let value = json!({
        "request_id": request_id,
        "reply_to": format!("llm.replies.{request_id}"),
        "frames": [frame(Json::Null, Some(json!({"ctx_request_id": 7, "request_type": "context_only"})))],
    });
    Input {
        payload: encode(&value, false),
        request_id: request_id.into(),
        json: false,
        expect: Expect::Gen,
    }
}

/// A terminal result: needs no ID.
pub fn terminal(request_id: &str) -> Input {
    let value = json!({
        "request_id": request_id,
        "reply_to": format!("llm.replies.{request_id}"),
        "frames": [frame(json!("eos"), None)],
    });
    Input {
        payload: encode(&value, false),
        request_id: request_id.into(),
        json: false,
        expect: Expect::Reply,
    }
}

/// Publishes every input into the prefill stream and waits for the stream's acks.
pub async fn publish_all(js: &jetstream::Context, inputs: &[Input]) {
    for chunk in inputs.chunks(500) {
        let mut acks = Vec::with_capacity(chunk.len());
        for input in chunk {
            let mut headers = HeaderMap::new();
            if input.json {
                headers.insert("Content-Type", "application/json");
            }
            headers.insert("traceparent", format!("00-{:032x}-00f067aa0ba902b7-01", 1));
            let ack = js
                .publish_with_headers(PREFILL, headers, input.payload.clone().into())
                .await
                .expect("publish into the prefill stream");
            acks.push(ack);
        }
        for ack in acks {
            ack.await.expect("prefill stream stored the result");
        }
    }
}

/// The request ID an output belongs to: from its body, or from the poison bytes.
pub fn request_id_of(payload: &[u8], headers: Option<&HeaderMap>) -> String {
    if let Some(rest) = payload.strip_prefix(&[0xc1, 0x00][..]) {
        return String::from_utf8_lossy(rest)
            .trim_start_matches("poison:")
            .to_string();
    }
    let json = headers
        .and_then(|h| h.get("Content-Type"))
        .is_some_and(|v| v.as_str() == "application/json");
    let encoding = if json {
        Encoding::Json
    } else {
        Encoding::MsgPack
    };
    // Dead letters of JSON inputs carry no Content-Type: try both.
    let value = wire::decode(payload, encoding)
        .or_else(|_| wire::decode(payload, Encoding::Json))
        .unwrap_or_else(|e| {
            panic!(
                "undecodable output {e}: {:?} {headers:?}",
                String::from_utf8_lossy(payload)
            )
        });
    field(&value, "request_id")
        .and_then(|v| v.as_str())
        .unwrap_or("<none>")
        .to_string()
}

pub fn field<'a>(value: &'a rmpv::Value, key: &str) -> Option<&'a rmpv::Value> {
    value
        .as_map()
        .and_then(|m| prefill_handoff::wire::map::get(m, key))
}

/// One output seen on a core subscription.
#[derive(Debug, Clone)]
pub struct Seen {
    pub kind: Expect,
    pub subject: String,
    pub request_id: String,
    pub payload: Vec<u8>,
    pub headers: Option<HeaderMap>,
}

/// Every output published on GEN, the reply subjects and the dead-letter subject.
#[derive(Clone)]
pub struct Collector {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Collector {
    pub async fn start(client: &Client) -> Collector {
        let seen = Arc::new(Mutex::new(Vec::new()));
        for (subject, kind) in [
            (GEN, Expect::Gen),
            ("llm.replies.>", Expect::Reply),
            (DEAD, Expect::Dead),
        ] {
            let mut sub = client.subscribe(subject).await.expect("subscribe");
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    let request_id = request_id_of(&m.payload, m.headers.as_ref());
                    seen.lock().unwrap().push(Seen {
                        kind,
                        subject: m.subject.to_string(),
                        request_id,
                        payload: m.payload.to_vec(),
                        headers: m.headers.clone(),
                    });
                }
            });
        }
        client.flush().await.expect("flush subscriptions");
        Collector { seen }
    }

    pub fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until at least `n` outputs were seen; false on timeout.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.len() >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.len() >= n
    }

    /// Outputs per request ID and kind.
    pub fn counts(&self) -> BTreeMap<(String, Expect), usize> {
        let mut counts = BTreeMap::new();
        for s in self.all() {
            *counts.entry((s.request_id, s.kind)).or_insert(0) += 1;
        }
        counts
    }
}

/// The request IDs of every decode job stored in the GEN stream, in order.
pub async fn gen_stream_request_ids(js: &jetstream::Context) -> Vec<String> {
    stream_contents(js, "LLM_GEN")
        .await
        .into_iter()
        .map(|s| s.request_id)
        .collect()
}

/// Every message stored in a stream, attributed to its request ID.
pub async fn stream_contents(js: &jetstream::Context, name: &str) -> Vec<Seen> {
    let stream: Stream = js.get_stream(name).await.expect("stream");
    let total = stream.get_info().await.expect("info").state.messages as usize;
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .expect("ordered consumer");
    let mut messages = consumer.messages().await.expect("messages");
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("stream message within 10 s")
            .expect("stream open")
            .expect("message");
        let subject = m.subject.to_string();
        let kind = if subject == GEN {
            Expect::Gen
        } else if subject == DEAD {
            Expect::Dead
        } else {
            Expect::Reply
        };
        out.push(Seen {
            kind,
            request_id: request_id_of(&m.payload, m.headers.as_ref()),
            subject,
            payload: m.payload.to_vec(),
            headers: m.headers.clone(),
        });
    }
    out
}

/// A stream that stores every reply and dead letter, so that outputs
/// published while a test's own connection is down are still counted.
pub async fn capture_outputs(js: &jetstream::Context) {
    js.create_stream(jetstream::stream::Config {
        name: "OUTPUTS".into(),
        subjects: vec!["llm.replies.>".into(), DEAD.into()],
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("capture stream");
}

/// Per request ID and kind, how many outputs.
pub fn count(seen: &[Seen]) -> BTreeMap<(String, Expect), usize> {
    let mut counts = BTreeMap::new();
    for s in seen {
        *counts.entry((s.request_id.clone(), s.kind)).or_insert(0) += 1;
    }
    counts
}

/// Checks that every input has at least one output of the expected kind and
/// nothing else; returns the duplicates (request ID, kind, count) to report.
pub fn check_outputs(inputs: &[Input], seen: &[Seen]) -> Vec<(String, Expect, usize)> {
    let counts = count(seen);
    let mut missing = Vec::new();
    for input in inputs {
        if counts
            .get(&(input.request_id.clone(), input.expect))
            .copied()
            .unwrap_or(0)
            == 0
        {
            missing.push(format!("{} {:?}", input.request_id, input.expect));
        }
    }
    assert!(
        missing.is_empty(),
        "{} results have no output, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let expected: std::collections::BTreeSet<_> = inputs
        .iter()
        .map(|i| (i.request_id.clone(), i.expect))
        .collect();
    let strays: Vec<_> = counts.keys().filter(|k| !expected.contains(k)).collect();
    assert!(
        strays.is_empty(),
        "outputs of the wrong kind or for unknown requests: {strays:?}"
    );
    counts
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((id, kind), n)| (id, kind, n))
        .collect()
}

/// Messages left in the prefill work queue.
pub async fn prefill_left(js: &jetstream::Context) -> u64 {
    let stream = js.get_stream("LLM_PREFILL").await.expect("prefill stream");
    stream.get_info().await.expect("info").state.messages
}

/// The shared consumer's counters: (ack pending, redelivered, pending).
pub async fn consumer_counters(js: &jetstream::Context) -> (usize, usize, u64) {
    let stream = js.get_stream("LLM_PREFILL").await.expect("prefill stream");
    let info = stream.consumer_info("handoff").await.expect("consumer");
    (info.num_ack_pending, info.num_redelivered, info.num_pending)
}

/// Waits until the work queue is empty and nothing is pending an ack.
pub async fn wait_drained(js: &jetstream::Context, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(stream) = js.get_stream("LLM_PREFILL").await
            && let (Ok(info), Ok(c)) = (
                stream.get_info().await,
                stream.consumer_info("handoff").await,
            )
            && info.state.messages == 0
            && c.num_ack_pending == 0
            && c.num_pending == 0
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Runs `setup` as an operator would before anything is published.
pub async fn setup(js: &jetstream::Context, config: &Config) {
    durable::setup::ensure(js, config).await.expect("setup");
}

/// How many deliveries the shared consumer has made (redeliveries included).
pub async fn deliveries(js: &jetstream::Context) -> u64 {
    let stream = js.get_stream("LLM_PREFILL").await.expect("prefill stream");
    let info = stream.consumer_info("handoff").await.expect("consumer");
    info.delivered.consumer_sequence
}

/// The prefill stream's and the consumer's state, for failure messages.
pub async fn queue_state(js: &jetstream::Context) -> String {
    let stream = js.get_stream("LLM_PREFILL").await.expect("prefill stream");
    let info = stream.get_info().await.expect("info");
    let c = stream.consumer_info("handoff").await.expect("consumer");
    format!(
        "stream: {:?}; consumer: delivered {:?} ack_floor {:?} ack_pending {} redelivered {} pending {} waiting {}",
        info.state,
        c.delivered,
        c.ack_floor,
        c.num_ack_pending,
        c.num_redelivered,
        c.num_pending,
        c.num_waiting
    )
}

/// Waits until the consumer has delivered and settled everything.
pub async fn wait_consumed(js: &jetstream::Context, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(stream) = js.get_stream("LLM_PREFILL").await
            && let Ok(c) = stream.consumer_info("handoff").await
            && c.num_ack_pending == 0
            && c.num_pending == 0
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
