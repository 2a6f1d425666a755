//! Deadlines and cancellation at the handoff (contract 10) against a real
//! nats-server, in core and JetStream mode: a result past its deadline or
//! cancelled gets its error response and one KV release notice, and no
//! decode job; a future deadline travels with the job; a cancel published
//! while no JetStream worker runs is still honoured.

use crate::common;
use crate::common::jetstream_support::{self, LibWorker};
use crate::common::worker_support::{self, InProcess, fixed_identity};

use async_nats::{Client, HeaderMap, Message};
use common::Nats;
use futures::StreamExt;
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout};
use serde_json::{Value as Json, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const GEN: &str = "llm.gen.jobs";
const RELEASE: &str = "llm.kv.release";
const CANCEL: &str = "llm.handoff.cancel";
const PREFILL: &str = "llm.prefill.results";
const WAIT: Duration = Duration::from_secs(30);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Engine params of the three shapes, as a prefill engine returns them.
fn params(backend: &str) -> Json {
    match backend {
        "trtllm" => {
            json!({"ctx_request_id": 7, "request_type": "context_only", "opaque_state": [1, 2]})
        }
        "sglang" => {
            json!({"bootstrap_host": "10.0.0.5", "bootstrap_port": 8998, "bootstrap_room": 42})
        }
        _ => {
            json!({"remote_engine_id": "engine-a", "remote_block_ids": [3, 4], "remote_port": 5600})
        }
    }
}

/// A prefill result for `id`, answered on `llm.replies.{id}`: decode-bound
/// with `backend`'s params, or terminal (`stop`).
fn result(id: &str, backend: &str, terminal: bool) -> Json {
    let mut frame =
        json!({"token_ids": [42], "text": "Hi", "disaggregated_params": params(backend)});
    frame["finish_reason"] = if terminal {
        json!("stop")
    } else {
        json!("length")
    };
    json!({"request_id": id, "reply_to": format!("llm.replies.{id}"), "frames": [frame]})
}

fn with_deadline(mut result: Json, deadline: Json) -> Json {
    result["deadline_ms"] = deadline;
    result
}

fn msgpack(value: &Json) -> Vec<u8> {
    rmp_serde::to_vec_named(value).expect("encode")
}

fn deadline_header(ms: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Handoff-Deadline", ms);
    headers
}

fn json_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    headers
}

/// What a test publishes: a body and its headers.
struct Publish {
    body: Vec<u8>,
    headers: HeaderMap,
}

fn plain(body: &Json) -> Publish {
    Publish {
        body: msgpack(body),
        headers: HeaderMap::new(),
    }
}

/// The outputs a worker publishes, by subject kind, as JSON.
#[derive(Default)]
struct Seen {
    replies: Vec<Json>,
    jobs: Vec<(Json, Option<String>)>,
    releases: Vec<(Json, Option<String>)>,
}

/// Everything on the reply, GEN and release subjects, in arrival order.
struct Watch {
    seen: Arc<Mutex<Seen>>,
    _task: tokio::task::JoinHandle<()>,
}

fn decode(message: &Message) -> Json {
    let json = message
        .headers
        .as_ref()
        .and_then(|h| h.get("Content-Type"))
        .is_some_and(|v| v.as_str() == "application/json");
    if json {
        serde_json::from_slice(&message.payload).expect("JSON output")
    } else {
        rmp_serde::from_slice(&message.payload).expect("MessagePack output")
    }
}

fn header(message: &Message, name: &str) -> Option<String> {
    Some(message.headers.as_ref()?.get(name)?.as_str().to_string())
}

impl Watch {
    async fn start(client: &Client) -> Watch {
        let mut subs = futures::stream::SelectAll::new();
        for subject in ["llm.replies.>", GEN, RELEASE] {
            subs.push(client.subscribe(subject).await.expect("subscribe"));
        }
        client.flush().await.expect("flush");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            while let Some(message) = subs.next().await {
                let body = decode(&message);
                let mut seen = sink.lock().unwrap();
                match message.subject.as_str() {
                    GEN => seen.jobs.push((body, header(&message, "Handoff-Deadline"))),
                    RELEASE => seen.releases.push((body, header(&message, "Nats-Msg-Id"))),
                    _ => seen.replies.push(body),
                }
            }
        });
        Watch { seen, _task: task }
    }

    fn count(&self) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.replies.len() + seen.jobs.len() + seen.releases.len()
    }

    /// Waits for `n` outputs in all, then a little longer so that extra
    /// ones would show.
    async fn wait(&self, n: usize) {
        let deadline = Instant::now() + WAIT;
        while self.count() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    /// The error code of each reply, or "terminal", by request ID.
    fn replies(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for reply in &self.seen.lock().unwrap().replies {
            let id = reply["request_id"].as_str().unwrap_or_default().to_string();
            let what = match reply["kind"].as_str() {
                Some("error") => reply["error"]["code"].as_str().unwrap_or("?").to_string(),
                other => other.unwrap_or("?").to_string(),
            };
            out.entry(id).or_default().push(what);
        }
        out
    }

    fn jobs(&self) -> BTreeMap<String, Vec<(Json, Option<String>)>> {
        let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for (job, header) in &self.seen.lock().unwrap().jobs {
            let id = job["request_id"].as_str().unwrap_or_default().to_string();
            out.entry(id)
                .or_default()
                .push((job.clone(), header.clone()));
        }
        out
    }

    fn releases(&self) -> BTreeMap<String, Vec<(Json, Option<String>)>> {
        let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for (notice, msg_id) in &self.seen.lock().unwrap().releases {
            let id = notice["request_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            out.entry(id)
                .or_default()
                .push((notice.clone(), msg_id.clone()));
        }
        out
    }
}

/// The deadline cases: (request ID, what to publish, the reply expected
/// or "job", whether a release notice is expected).
fn deadline_cases(now: u64) -> Vec<(String, Publish, &'static str, bool)> {
    let past = json!(now - 60_000);
    let future = now + 600_000;
    let id = |s: &str| s.to_string();
    vec![
        (
            id("body-past"),
            plain(&with_deadline(
                result("body-past", "trtllm", false),
                past.clone(),
            )),
            "deadline_exceeded",
            true,
        ),
        (
            id("header-past"),
            Publish {
                body: msgpack(&result("header-past", "sglang", false)),
                headers: deadline_header(&(now - 60_000).to_string()),
            },
            "deadline_exceeded",
            true,
        ),
        (
            id("body-past-header-future"),
            Publish {
                body: msgpack(&with_deadline(
                    result("body-past-header-future", "vllm", false),
                    past.clone(),
                )),
                headers: deadline_header(&future.to_string()),
            },
            "deadline_exceeded",
            true,
        ),
        (
            id("body-future-header-past"),
            Publish {
                body: msgpack(&with_deadline(
                    result("body-future-header-past", "trtllm", false),
                    json!(future),
                )),
                headers: deadline_header(&(now - 60_000).to_string()),
            },
            "deadline_exceeded",
            true,
        ),
        (
            id("future"),
            Publish {
                body: msgpack(&with_deadline(
                    result("future", "trtllm", false),
                    json!(future + 5),
                )),
                headers: deadline_header(&future.to_string()),
            },
            "job",
            false,
        ),
        (
            id("terminal-past"),
            plain(&with_deadline(
                result("terminal-past", "trtllm", true),
                past,
            )),
            "terminal",
            false,
        ),
        (
            id("float"),
            plain(&with_deadline(result("float", "trtllm", false), json!(1.5))),
            "invalid_deadline",
            false,
        ),
        (
            id("header-words"),
            Publish {
                body: msgpack(&result("header-words", "trtllm", false)),
                headers: deadline_header("tomorrow"),
            },
            "invalid_deadline",
            false,
        ),
    ]
}

/// Checks the outputs of [`deadline_cases`]: one output each, of the
/// expected kind, one release notice where expected, and the future
/// deadline carried by its job.
fn check_deadline_cases(watch: &Watch, cases: &[(String, Publish, &str, bool)], future: u64) {
    let (replies, jobs, releases) = (watch.replies(), watch.jobs(), watch.releases());
    for (id, _, want, notice) in cases {
        if *want == "job" {
            let job = jobs.get(id).unwrap_or_else(|| panic!("{id}: a decode job"));
            assert_eq!(job.len(), 1, "{id}: one job");
            assert!(!replies.contains_key(id), "{id}: no reply");
            let (body, header) = &job[0];
            assert_eq!(
                body["deadline_ms"],
                json!(future),
                "{id}: the earlier deadline"
            );
            assert_eq!(header.as_deref(), Some(future.to_string().as_str()), "{id}");
        } else {
            assert_eq!(replies.get(id), Some(&vec![want.to_string()]), "{id}");
            assert!(!jobs.contains_key(id), "{id}: no decode job");
        }
        let got = releases.get(id).map_or(0, Vec::len);
        assert_eq!(got, usize::from(*notice), "{id}: release notices");
        if let Some(notice) = releases.get(id) {
            let (body, msg_id) = &notice[0];
            assert_eq!(body["reason"], "deadline_exceeded", "{id}");
            assert_eq!(msg_id.as_deref(), Some(format!("release-{id}").as_str()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_deadlines_are_decided_at_the_handoff() {
    let nats = Nats::start();
    let config = worker_support::config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(5)).await;
    let test = worker_support::client(&nats.url()).await;
    let watch = Watch::start(&test).await;

    let now = now_ms();
    let cases = deadline_cases(now);
    for (_, publish, _, _) in &cases {
        test.publish_with_headers(
            PREFILL,
            publish.headers.clone(),
            publish.body.clone().into(),
        )
        .await
        .expect("publish");
    }
    let expected = cases.len() + cases.iter().filter(|c| c.3).count();
    watch.wait(expected).await;
    check_deadline_cases(&watch, &cases, now + 600_000);
    assert_eq!(watch.count(), expected, "nothing else was published");
    let report = worker.stop().await;
    assert_eq!(report.counts.failed, 0);
}

/// A cancel message for `id`: MessagePack, or JSON with its content type.
fn cancel(id: &str, json_encoded: bool) -> Publish {
    let body = json!({"request_id": id, "reason": "client disconnected"});
    if json_encoded {
        Publish {
            body: serde_json::to_vec(&body).expect("json"),
            headers: json_headers(),
        }
    } else {
        plain(&body)
    }
}

/// The cancelled requests of the cancel tests: (request ID, backend, JSON
/// cancel), and one request never cancelled.
const CANCELLED: [(&str, &str, bool); 3] = [
    ("cancel-trt", "trtllm", false),
    ("cancel-sgl", "sglang", true),
    ("cancel-vllm", "vllm", false),
];
const KEPT: &str = "not-cancelled";

/// The cancelled requests get `cancelled` and one release notice naming
/// their backend and carrying their params as sent; the other one a job.
fn check_cancels(watch: &Watch) {
    let (replies, jobs, releases) = (watch.replies(), watch.jobs(), watch.releases());
    for (id, backend, _) in CANCELLED {
        assert_eq!(
            replies.get(id),
            Some(&vec!["cancelled".to_string()]),
            "{id}"
        );
        assert!(!jobs.contains_key(id), "{id}: no decode job");
        let notices = releases.get(id).unwrap_or_else(|| panic!("{id}: a notice"));
        assert_eq!(notices.len(), 1, "{id}: one notice");
        let (notice, msg_id) = &notices[0];
        assert_eq!(notice["reason"], "cancelled");
        assert_eq!(notice["backend"], backend);
        assert_eq!(
            notice["handoff"],
            params(backend),
            "{id}: params as received"
        );
        assert!(notice["worker"]["instance_id"].is_string());
        assert_eq!(msg_id.as_deref(), Some(format!("release-{id}").as_str()));
    }
    assert_eq!(
        jobs.get(KEPT).map(Vec::len),
        Some(1),
        "another request is unaffected"
    );
    assert!(!replies.contains_key(KEPT) && !releases.contains_key(KEPT));
}

/// Waits until `check` holds, for up to [`WAIT`].
async fn until(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    while !check() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

fn cancels_counted(worker: &InProcess, event: &str) -> f64 {
    let samples = common::prometheus_samples(&worker.metrics.encode());
    samples
        .get(&format!("handoff_cancels_total{{event=\"{event}\"}}"))
        .copied()
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_cancels_refuse_the_handoff_and_release_the_kv() {
    let nats = Nats::start();
    let config = worker_support::config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(6)).await;
    let test = worker_support::client(&nats.url()).await;
    let watch = Watch::start(&test).await;

    for (id, _, json_encoded) in CANCELLED {
        let c = cancel(id, json_encoded);
        test.publish_with_headers(CANCEL, c.headers, c.body.into())
            .await
            .expect("publish");
    }
    // A malformed one: counted, never answered, not fatal.
    test.publish(CANCEL, b"\xc1 not a cancel".to_vec().into())
        .await
        .expect("publish");
    // The cancel listener and the results are separate subscriptions: the
    // results go once the worker holds the cancels.
    assert!(
        until(|| cancels_counted(&worker, "recorded") == 3.0).await,
        "the worker records the three cancels"
    );
    assert!(until(|| cancels_counted(&worker, "malformed") == 1.0).await);
    for (id, backend, _) in CANCELLED {
        test.publish(PREFILL, msgpack(&result(id, backend, false)).into())
            .await
            .expect("publish");
    }
    test.publish(PREFILL, msgpack(&result(KEPT, "trtllm", false)).into())
        .await
        .expect("publish");
    watch.wait(CANCELLED.len() * 2 + 1).await;
    check_cancels(&watch);
    assert_eq!(watch.count(), CANCELLED.len() * 2 + 1);

    // A cancel after the decode job left: counted as late.
    let late = cancel(KEPT, false);
    test.publish_with_headers(CANCEL, late.headers, late.body.into())
        .await
        .expect("publish");
    assert!(
        until(|| cancels_counted(&worker, "late") == 1.0).await,
        "a cancel after the job left is late"
    );
    let report = worker.stop().await;
    assert_eq!(report.counts.failed, 0);
}

fn js_config(nats: &Nats) -> prefill_handoff::config::Config {
    jetstream_support::config(nats)
}

/// Publishes into the prefill stream (or any stream's subject) and waits
/// for the stream's ack.
async fn js_publish(js: &async_nats::jetstream::Context, subject: &str, publish: Publish) {
    js.publish_with_headers(subject.to_string(), publish.headers, publish.body.into())
        .await
        .expect("publish")
        .await
        .expect("stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_deadlines_and_cancels_kept_while_no_worker_ran() {
    let nats = Nats::start();
    let config = js_config(&nats);
    let test = worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    let watch = Watch::start(&test).await;

    // No worker runs: the cancels are kept by the cancel stream, the
    // results by the prefill stream.
    for (id, _, json_encoded) in CANCELLED {
        js_publish(&js, CANCEL, cancel(id, json_encoded)).await;
    }
    for (id, backend, _) in CANCELLED {
        js_publish(&js, PREFILL, plain(&result(id, backend, false))).await;
    }
    js_publish(&js, PREFILL, plain(&result(KEPT, "trtllm", false))).await;
    let now = now_ms();
    let cases = deadline_cases(now);
    for (_, publish, _, _) in cases {
        js_publish(&js, PREFILL, publish).await;
    }
    let cases = deadline_cases(now);

    let worker = LibWorker::start(&config, jetstream_support::fixed_identity(8)).await;
    let expected = CANCELLED.len() * 2 + 1 + cases.len() + cases.iter().filter(|c| c.3).count();
    watch.wait(expected).await;
    check_cancels(&watch);
    check_deadline_cases(&watch, &cases, now + 600_000);
    assert_eq!(watch.count(), expected, "nothing else was published");
    assert!(
        jetstream_support::wait_drained(&js, WAIT).await,
        "every result acked"
    );
    worker.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_a_redelivery_after_the_deadline_is_deadline_exceeded() {
    let nats = Nats::start();
    let config = js_config(&nats);
    let test = worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    let watch = Watch::start(&test).await;
    // A worker without a slot cannot mint the ID a TensorRT-LLM handoff
    // needs: it asks for redelivery until the deadline has passed, and then
    // the deadline decides without an ID.
    let fenced = prefill_handoff::identity::Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    let worker = LibWorker::start(&config, fenced).await;
    let deadline = now_ms() + 1_500;
    let body = with_deadline(result("late", "trtllm", false), json!(deadline));
    js_publish(&js, PREFILL, plain(&body)).await;

    watch.wait(2).await;
    assert_eq!(
        watch.replies().get("late"),
        Some(&vec!["deadline_exceeded".to_string()])
    );
    assert_eq!(watch.releases().get("late").map(Vec::len), Some(1));
    assert!(watch.jobs().is_empty(), "no decode job");
    assert!(
        jetstream_support::deliveries(&js).await > 1,
        "answered on a redelivery"
    );
    assert!(jetstream_support::wait_drained(&js, WAIT).await);
    worker.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_an_unconsumed_job_leaves_gen_at_its_deadline_on_2_11_and_later() {
    let nats = Nats::start();
    let version = nats.version();
    if !prefill_handoff::setup::supports_msg_ttl(&version) {
        println!("nats-server {version} has no per-message TTL; nothing to check");
        return;
    }
    let config = js_config(&nats);
    let test = worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    let worker = LibWorker::start(&config, jetstream_support::fixed_identity(9)).await;
    let body = with_deadline(result("expiring", "sglang", false), json!(now_ms() + 2_000));
    js_publish(&js, PREFILL, plain(&body)).await;
    js_publish(&js, PREFILL, plain(&result("lasting", "sglang", false))).await;

    let gen_messages = || async {
        let mut stream = js.get_stream("LLM_GEN").await.expect("GEN");
        stream.info().await.expect("info").state.messages
    };
    let mut held = 0;
    let deadline = Instant::now() + WAIT;
    while held < 2 && Instant::now() < deadline {
        held = gen_messages().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(held, 2, "both jobs stored");
    // Gone within a generous bound after its deadline; the job without a
    // deadline stays.
    let deadline = Instant::now() + WAIT;
    while gen_messages().await > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let left = jetstream_support::stream_contents(&js, "LLM_GEN").await;
    let ids: Vec<&str> = left.iter().map(|s| s.request_id.as_str()).collect();
    assert_eq!(ids, ["lasting"], "the expired job left GEN");
    worker.stop().await.expect("stop");
}

/// `prefill-handoff cancel` as an operator runs it.
fn cancel_command(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
        .arg("cancel")
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run prefill-handoff cancel")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_the_cancel_command_cancels_for_every_worker() {
    let nats = Nats::start();
    let config = worker_support::config(&nats.url());
    let worker = InProcess::start(&config, fixed_identity(10)).await;
    let test = worker_support::client(&nats.url()).await;
    let watch = Watch::start(&test).await;
    let url = nats.url();
    let out = tokio::task::block_in_place(|| {
        cancel_command(&["--nats-url", &url, "--reason", "operator", "--json", "op-1"])
    });
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "cancelled op-1\n");
    assert!(until(|| cancels_counted(&worker, "recorded") == 1.0).await);
    test.publish(PREFILL, msgpack(&result("op-1", "vllm", false)).into())
        .await
        .expect("publish");
    watch.wait(2).await;
    assert_eq!(
        watch.replies().get("op-1"),
        Some(&vec!["cancelled".to_string()])
    );
    assert_eq!(watch.releases().get("op-1").map(Vec::len), Some(1));
    // A request ID the contract cannot hold is a usage error.
    let long = "x".repeat(257);
    let out = tokio::task::block_in_place(|| cancel_command(&["--nats-url", &url, &long]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_the_cancel_command_stores_its_cancels() {
    let nats = Nats::start();
    let config = js_config(&nats);
    let test = worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    let url = nats.url();
    let out = tokio::task::block_in_place(|| {
        cancel_command(&["--nats-url", &url, "--mode", "jetstream", "op-1", "op-2"])
    });
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut kept = js.get_stream("LLM_CANCEL").await.expect("cancel stream");
    assert_eq!(kept.info().await.expect("info").state.messages, 2);
}
