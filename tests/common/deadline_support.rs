//! Shared pieces of the deadline and cancel tests (`tests/server/deadlines.rs`):
//! prefill results with deadlines for the three engine shapes, cancel
//! messages, and a watch on the reply, GEN and KV release subjects.

use crate::common::fence::Fence;
use crate::common::messages::{decode_output, header, msgpack};
use crate::common::poll_until;
use crate::common::worker_support::InProcess;
use async_nats::{Client, HeaderMap};
use futures::StreamExt;
use serde_json::{Value as Json, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const GEN: &str = "llm.gen.jobs";
pub const RELEASE: &str = "llm.kv.release";
pub const CANCEL: &str = "llm.handoff.cancel";
pub const PREFILL: &str = "llm.prefill.results";
pub const WAIT: Duration = Duration::from_secs(30);

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Engine params of the three shapes, as a prefill engine returns them.
pub fn params(backend: &str) -> Json {
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
pub fn result(id: &str, backend: &str, terminal: bool) -> Json {
    let mut frame =
        json!({"token_ids": [42], "text": "Hi", "disaggregated_params": params(backend)});
    frame["finish_reason"] = if terminal {
        json!("stop")
    } else {
        json!("length")
    };
    json!({"request_id": id, "reply_to": format!("llm.replies.{id}"), "frames": [frame]})
}

pub fn with_deadline(mut result: Json, deadline: Json) -> Json {
    result["deadline_ms"] = deadline;
    result
}

pub fn deadline_header(ms: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Handoff-Deadline", ms);
    headers
}

pub fn json_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    headers
}

/// What a test publishes: a body and its headers.
pub struct Publish {
    pub body: Vec<u8>,
    pub headers: HeaderMap,
}

pub fn plain(body: &Json) -> Publish {
    Publish {
        body: msgpack(body),
        headers: HeaderMap::new(),
    }
}

/// The outputs a worker publishes, by subject kind, as JSON.
#[derive(Default)]
pub struct Seen {
    pub replies: Vec<Json>,
    pub jobs: Vec<(Json, Option<String>)>,
    pub releases: Vec<(Json, Option<String>)>,
}

/// Everything on the reply, GEN and release subjects, in arrival order.
pub struct Watch {
    pub seen: Arc<Mutex<Seen>>,
    fence: Fence,
    _task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Subscribes on `client`; returns once the server has the subscription
    /// (a fence came back through it).
    pub async fn start(client: &Client) -> Watch {
        // One subscription, so that a fence is seen after everything the
        // server routed before it; the fences under it, on a subject no
        // worker uses.
        let mut sub = client.subscribe("llm.>").await.expect("subscribe");
        let fence = Fence::new(client, "llm.test-fence");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (sink, fenced) = (seen.clone(), fence.clone());
        let task = tokio::spawn(async move {
            while let Some(message) = sub.next().await {
                let subject = message.subject.as_str();
                if fenced.came_back(subject) {
                    continue;
                }
                let header = |name| header(message.headers.as_ref(), name).map(str::to_string);
                let mut seen = sink.lock().unwrap();
                match subject {
                    GEN => seen
                        .jobs
                        .push((decode_output(&message), header("Handoff-Deadline"))),
                    RELEASE => seen
                        .releases
                        .push((decode_output(&message), header("Nats-Msg-Id"))),
                    s if s.starts_with("llm.replies.") => {
                        seen.replies.push(decode_output(&message))
                    }
                    // What the test publishes: results, cancels.
                    _ => {}
                }
            }
        });
        let watch = Watch {
            seen,
            fence,
            _task: task,
        };
        watch.fence().await;
        watch
    }

    /// Returns once this watch has recorded everything the server had
    /// routed to it before the call ([`Fence`]).
    pub async fn fence(&self) {
        self.fence.pass().await;
    }

    pub fn count(&self) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.replies.len() + seen.jobs.len() + seen.releases.len()
    }

    /// Waits for `n` outputs in all and for `settled` to say, from the
    /// counters of the worker or the server, that nothing more is coming;
    /// then fences, so that everything published is here, extra outputs
    /// included.
    pub async fn wait<F: Future<Output = bool>>(&self, n: usize, settled: impl Fn() -> F) {
        poll_until(WAIT, || async { self.count() >= n && settled().await }).await;
        self.fence().await;
    }

    /// The error code of each reply, or "terminal", by request ID.
    pub fn replies(&self) -> BTreeMap<String, Vec<String>> {
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

    pub fn jobs(&self) -> BTreeMap<String, Vec<(Json, Option<String>)>> {
        let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for (job, header) in &self.seen.lock().unwrap().jobs {
            let id = job["request_id"].as_str().unwrap_or_default().to_string();
            out.entry(id)
                .or_default()
                .push((job.clone(), header.clone()));
        }
        out
    }

    pub fn releases(&self) -> BTreeMap<String, Vec<(Json, Option<String>)>> {
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
pub fn deadline_cases(now: u64) -> Vec<(String, Publish, &'static str, bool)> {
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
pub fn check_deadline_cases(watch: &Watch, cases: &[(String, Publish, &str, bool)], future: u64) {
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

/// A cancel message for `id`: MessagePack, or JSON with its content type.
pub fn cancel(id: &str, json_encoded: bool) -> Publish {
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
pub const CANCELLED: [(&str, &str, bool); 3] = [
    ("cancel-trt", "trtllm", false),
    ("cancel-sgl", "sglang", true),
    ("cancel-vllm", "vllm", false),
];
pub const KEPT: &str = "not-cancelled";

/// The cancelled requests get `cancelled` and one release notice naming
/// their backend and carrying their params as sent; the other one a job.
pub fn check_cancels(watch: &Watch) {
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

pub fn cancels_counted(worker: &InProcess, event: &str) -> f64 {
    let samples = super::prometheus_samples(&worker.metrics.encode());
    samples
        .get(&format!("handoff_cancels_total{{event=\"{event}\"}}"))
        .copied()
        .unwrap_or(0.0)
}

/// Publishes into the prefill stream (or any stream's subject) and waits
/// for the stream's ack.
pub async fn js_publish(js: &async_nats::jetstream::Context, subject: &str, publish: Publish) {
    js.publish_with_headers(subject.to_string(), publish.headers, publish.body.into())
        .await
        .expect("publish")
        .await
        .expect("stored");
}
