//! Helpers for the worker tests: an in-process worker on a real NATS server,
//! a collector that sees every message on the server, and a catalogue of
//! prefill results with the output the contract requires for each.

pub mod cases;

use crate::common::fence::Fence;
use crate::common::{http_get, outputs_total, poll_until};
use async_nats::{Client, Message};
use futures::StreamExt;
use prefill_handoff::config::{Config, MissingDisaggRequestId};
use prefill_handoff::identity::Identity;
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout, MachineId};
use prefill_handoff::metrics::{Metrics, Readiness};
use prefill_handoff::pipeline::serve;
use prefill_handoff::pipeline::{Report, Stats};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const PREFILL: &str = "llm.prefill.results";
pub const GEN: &str = "llm.gen.jobs";
pub const DEAD: &str = "llm.handoff.dead";

/// The default configuration pointed at a test server, but for a worker
/// that mints a missing `disagg_request_id` (the traffic's TensorRT-LLM
/// results carry none).
pub fn config(nats_url: &str) -> Config {
    let mut config = Config::default();
    config.nats.url = nats_url.to_string();
    config.trtllm.missing_disagg_request_id = MissingDisaggRequestId::Mint;
    config.resolve().expect("the default config resolves")
}

/// An identity holding `machine_id` for good (no etcd).
pub fn fixed_identity(machine_id: u16) -> Identity {
    Identity::fixed(
        IdLayout::Rc22,
        DEFAULT_EPOCH_UNIX_MS,
        MachineId::new(i128::from(machine_id)).expect("machine id in range"),
    )
}

/// A worker running in this process, stopped by [`InProcess::stop`].
pub struct InProcess {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Report>,
    stats: Arc<Stats>,
    /// The worker's connection, for round trips behind what it published.
    client: Client,
    /// The worker's metrics.
    pub metrics: Metrics,
}

impl InProcess {
    /// Starts a worker and returns once the server has its subscriptions.
    pub async fn start(config: &Config, identity: Identity) -> InProcess {
        init_logging();
        let readiness = Readiness::new(identity.watch());
        let client = prefill_handoff::connect::connect(&config.nats, Metrics::new(), readiness)
            .await
            .expect("connect");
        let metrics = Metrics::new();
        let worker = serve::start(&client, config, identity, metrics.clone(), None, None)
            .await
            .expect("subscribe");
        // A round trip, not a flush: a flush only writes the socket, and a
        // result published on another connection right after could reach
        // the server before the subscription does (and go nowhere).
        round_trip(&client).await;
        let stats = worker.stats();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(worker.run(async move {
            let _ = stopped.await;
        }));
        InProcess {
            stop: Some(stop),
            task,
            stats,
            client,
            metrics,
        }
    }

    /// True when the worker's counters say nothing more is coming: every
    /// result it has taken is settled (its output published, or its failure
    /// or deferral counted), and the server has everything the worker
    /// published (a round trip on its connection, with the counters
    /// unchanged across it).
    pub async fn settled(&self) -> bool {
        let before = self.stats.counts();
        if before.received != before.published + before.failed + before.deferred {
            return false;
        }
        round_trip(&self.client).await;
        self.stats.counts() == before
    }

    /// Asks the worker to shut down and waits for its report.
    pub async fn stop(mut self) -> Report {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .expect("the worker stops within 30 s")
            .expect("the worker task does not panic")
    }
}

/// Worker logs in the test output (shown for failing tests); `RUST_LOG` filters.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A plain client for the test's side.
pub async fn client(nats_url: &str) -> Client {
    async_nats::connect(nats_url)
        .await
        .expect("test client connects")
}

/// Returns once the server has processed everything this client published
/// before (and so routed it to subscribers). async-nats' `flush` only writes
/// the socket; a message to the client's own inbox comes back only after the
/// server has handled everything sent before it.
pub async fn round_trip(client: &Client) {
    let subject = format!("{HARNESS}.round-trip.{}", client.new_inbox());
    let mut echo = client.subscribe(subject.clone()).await.expect("subscribe");
    client.publish(subject, "".into()).await.expect("publish");
    tokio::time::timeout(Duration::from_secs(10), echo.next())
        .await
        .expect("the server echoes within 10 s")
        .expect("the subscription is open");
}

/// The subjects of the harness's round trips, which a collector leaves out.
const HARNESS: &str = "test.harness";

/// Every message the server routes to a `>` subscription (and to `$JS.>`
/// and `$SYS.>`, which `>` may not cover), recorded in arrival order.
pub struct Collector {
    seen: Arc<Mutex<Vec<Message>>>,
    fence: Fence,
    _task: JoinHandle<()>,
}

impl Collector {
    /// Subscribes on `client`; returns once the server has the
    /// subscriptions (a fence came back through them).
    pub async fn start(client: &Client) -> Collector {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut subs = futures::stream::SelectAll::new();
        for subject in [">", "$JS.>", "$SYS.>", "$KV.>"] {
            subs.push(client.subscribe(subject).await.expect("subscribe"));
        }
        let sink = Arc::clone(&seen);
        let fence = Fence::new(client, "test.harness.fence");
        let fenced = fence.clone();
        let task = tokio::spawn(async move {
            while let Some(message) = subs.next().await {
                if !fenced.came_back(message.subject.as_str()) {
                    sink.lock().unwrap().push(message);
                }
            }
        });
        let collector = Collector {
            seen,
            fence,
            _task: task,
        };
        collector.fence().await;
        collector
    }

    /// Returns once this collector has recorded everything the server had
    /// routed to it before the call ([`Fence`], through the `>`
    /// subscription).
    pub async fn fence(&self) {
        self.fence.pass().await;
    }

    /// Every message seen so far, except those on the prefill subject, the
    /// worker's drain fence (an empty message to its own inbox) and the
    /// harness's own.
    pub fn outputs(&self) -> Vec<Message> {
        self.all()
            .into_iter()
            .filter(|m| m.subject.as_str() != PREFILL)
            .filter(|m| !(m.subject.starts_with("_INBOX.") && m.payload.is_empty()))
            .collect()
    }

    /// Every message seen so far but the harness's round trips.
    pub fn all(&self) -> Vec<Message> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|m| !m.subject.starts_with(HARNESS))
            .cloned()
            .collect()
    }

    /// Waits until at least `n` outputs were seen and `settled` says, from
    /// the workers' counters, that nothing more is coming; then fences, so
    /// that everything the workers published is here, duplicates included.
    /// Returns the outputs (fewer than `n` after `timeout`).
    pub async fn wait_outputs<F: Future<Output = bool>>(
        &self,
        n: usize,
        timeout: Duration,
        settled: impl Fn() -> F,
    ) -> Vec<Message> {
        poll_until(timeout, || async {
            self.outputs().len() >= n && settled().await
        })
        .await;
        self.fence().await;
        self.outputs()
    }
}

/// The results a worker process has answered, by its metrics at
/// `metrics_addr` (`handoff_outputs_total`, every outcome). Blocking.
pub fn outputs_counted(metrics_addr: &str) -> u64 {
    outputs_total(&http_get(metrics_addr, "/metrics").body)
}
