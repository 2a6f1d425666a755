//! Shared pieces of the durable-mode tests: a test configuration, workers
//! run in the test process (library level), a mixed traffic generator
//! (`traffic.rs`), and ways to observe outputs and the queue (`observe.rs`).

mod observe;
mod traffic;

pub use observe::*;
pub use traffic::*;

use crate::common::Nats;
use async_nats::jetstream;
use prefill_handoff::config::{Config, MissingDisaggRequestId};
use prefill_handoff::identity::Identity;
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout, MachineId};
use prefill_handoff::metrics::Metrics;
use prefill_handoff::pipeline::serve::{self as durable, StartError};
use prefill_handoff::setup::JetStreamError;
use std::time::Duration;
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
    // The traffic's TensorRT-LLM results carry no ID: the worker mints.
    config.trtllm.missing_disagg_request_id = MissingDisaggRequestId::Mint;
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
    task: Option<JoinHandle<Result<(), StartError>>>,
    stop: Option<oneshot::Sender<()>>,
    /// The worker's metrics.
    pub metrics: Metrics,
}

impl LibWorker {
    pub async fn start(config: &Config, identity: Identity) -> LibWorker {
        init_logging();
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(
                prefill_handoff::connect::parse_url(&config.nats.url)
                    .expect("nats.url lists server URLs")
                    .addrs,
            )
            .await
            .expect("worker connects");
        let (stop, stopped) = oneshot::channel::<()>();
        let config = config.clone();
        let metrics = Metrics::new();
        let serving = metrics.clone();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            durable::serve(client, &config, identity, serving, None, shutdown)
                .await
                .map(drop)
        });
        LibWorker {
            task: Some(task),
            stop: Some(stop),
            metrics,
        }
    }

    /// The results it has answered (`handoff_outputs_total`, every outcome).
    pub fn outputs_counted(&self) -> u64 {
        crate::common::outputs_total(&self.metrics.encode())
    }

    /// Graceful stop: no new pulls, in-flight messages finished.
    pub async fn stop(mut self) -> Result<(), StartError> {
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

/// Runs `setup` as an operator would before anything is published, and
/// again, as an operator would, while the JetStream API times out: a
/// cluster formed moments ago, or two cores shared by several clusters at
/// once, can take longer than the client's 5 s to answer its first
/// requests (seen once in a CI run against nats-server 2.15: "looking up
/// stream LLM_PREFILL: request error: timed out"). Any other error, or
/// timeouts for 30 s, fail the test.
pub async fn setup(js: &jetstream::Context, config: &Config) {
    let timed_out = |e: &JetStreamError| {
        matches!(e, JetStreamError::Api(_)) && e.to_string().contains("timed out")
    };
    while_transient("setup", timed_out, || {
        prefill_handoff::setup::ensure(js, config)
    })
    .await;
}

/// The result of `attempt`, tried again every 0.5 s while its error is one
/// that passes (`transient`: the JetStream API timing out, no responders
/// while a stream leader is elected), for up to 30 s. Any other error, or
/// transient ones for 30 s, fail the test, with `what` in the message.
pub async fn while_transient<T, E: std::fmt::Debug, F: Future<Output = Result<T, E>>>(
    what: &str,
    transient: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match attempt().await {
            Ok(done) => return done,
            Err(e) if transient(&e) && tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = ?e, "{what} failed; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{what}: {e:?}"),
        }
    }
}
