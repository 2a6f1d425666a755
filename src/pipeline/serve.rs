//! Wires a configuration to the pipeline: the source and sink of the
//! configured mode, the redelivery rules, and the runner. The only place
//! that tells the two modes apart by name.

use super::cancels as listen;
use super::{GenStream, Pipeline, Report, Runner, Stats};
use crate::cancel::{self, Cancellations};
use crate::config::{Config, Mode};
use crate::decision::{Rules, RulesError};
use crate::identity::Identity;
use crate::metrics::{Metrics, Readiness};
use crate::redelivery::Redelivery;
use crate::setup::{self, JetStreamError};
use crate::telemetry::Telemetry;
use crate::transport::jetstream::{self, Puller, confirm::Confirmer, publish::Publisher};
use crate::transport::{CoreSink, Sink, Source, TransportError};
use async_nats::Client;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Why the worker could not start consuming.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The decision rules cannot be made (checked at load already).
    #[error(transparent)]
    Rules(#[from] RulesError),
    /// Core NATS: the subscriptions could not be made.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// JetStream: the stream or consumer is missing (and may not be
    /// created) or incompatible.
    #[error("cannot consume from JetStream: {0}")]
    JetStream(JetStreamError),
    /// JetStream: the server refused the worker's JetStream API requests
    /// for want of permissions; waiting would not change that.
    #[error(
        "cannot consume from JetStream: the NATS server refused this worker's user: {violation} ({request}); grant it the JetStream permissions of config/nats/handoff-permissions.conf (docs/security.md)"
    )]
    Denied { violation: String, request: String },
    /// The cancel subject could not be subscribed to, or the cancels kept
    /// by the server could not be loaded.
    #[error(transparent)]
    Cancels(#[from] listen::ListenError),
}

impl From<JetStreamError> for StartError {
    fn from(e: JetStreamError) -> StartError {
        StartError::JetStream(e)
    }
}

/// A worker ready to run: its runner and its source, and the cancel
/// listener it decides with.
pub struct Worker {
    runner: Runner,
    source: Source,
    /// Stops listening when the worker is dropped.
    _cancels: listen::Listener,
}

impl Worker {
    /// Live counters, readable while the worker runs.
    pub fn stats(&self) -> Arc<Stats> {
        self.runner.stats()
    }

    /// Runs until `shutdown` completes (or the source closes), then drains.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Report {
        self.runner.run(self.source, shutdown).await
    }
}

/// Starts consuming in `config.mode`: core NATS subscribes; JetStream opens
/// (with `jetstream.create`: creates) the consumer, waiting for a server
/// that does not answer yet. `readiness`, when given, is marked consuming
/// while JetStream pulls are sent. `telemetry`: each delivery's span
/// (`None`: no tracing, no span built).
pub async fn start(
    client: &Client,
    config: &Config,
    identity: Identity,
    metrics: Metrics,
    readiness: Option<Readiness>,
    telemetry: Option<Telemetry>,
) -> Result<Worker, StartError> {
    let options = super::Options::from_config(config);
    let rules = Rules::from_config(config)?;
    // Listening before the first result comes: every cancel published from
    // here on is heard.
    let cancellations = Arc::new(Cancellations::new(cancel::limits(&config.cancel)));
    let intake = listen::Intake::new(cancellations.clone(), metrics.clone());
    let cancels = listen::listen(client, &config.subjects.cancel, intake.clone()).await?;
    // The at-most-once pipeline; durable mode sets its redelivery and GEN.
    let gen_gate = Arc::new(super::gen_gate::GenGate::new(
        metrics.clone(),
        readiness.clone(),
    ));
    let pipeline = |sink| Pipeline {
        gen_gate: gen_gate.clone(),
        rules: rules.clone(),
        identity: identity.clone(),
        metrics: metrics.clone(),
        sink,
        redelivery: Redelivery::AT_MOST_ONCE,
        gen_stream: None,
        lookup_bound: Duration::ZERO,
        telemetry: telemetry.clone(),
        cancellations: cancellations.clone(),
    };
    match config.mode {
        Mode::Core => {
            let sink = Sink::Core(CoreSink::new(client.clone(), &config.subjects.gen_jobs));
            let runner = Runner::new(pipeline(sink), options);
            let source = Source::core(
                client,
                &config.prefill_subjects(),
                &config.queue_group,
                runner.limits(),
            )
            .await?;
            Ok(Worker {
                runner,
                source,
                _cancels: cancels,
            })
        }
        Mode::Jetstream => {
            let cancels = (intake, cancels);
            start_jetstream(
                client, config, pipeline, &metrics, options, readiness, cancels,
            )
            .await
        }
    }
}

/// JetStream: opens the consumer, takes its ack wait and delivery limit as
/// the server holds them, loads the cancels the server kept, and starts
/// pulling. `at_most_once` is the pipeline [`start`] made, which this gives
/// its redelivery and GEN, and `metrics` its metrics; `(intake, listener)`
/// are its cancels.
async fn start_jetstream(
    client: &Client,
    config: &Config,
    at_most_once: impl FnOnce(Sink) -> Pipeline,
    metrics: &Metrics,
    options: super::Options,
    readiness: Option<Readiness>,
    (intake, listener): (listen::Intake, listen::Listener),
) -> Result<Worker, StartError> {
    let js_config = &config.jetstream;
    let js = async_nats::jetstream::new(client.clone());
    let consumer = open_at_start(&js, config, readiness.as_ref()).await?;
    // The server's ack wait and delivery limit rule, whatever the config says.
    let (ack_wait, max_deliver) = (
        consumer.cached_info().config.ack_wait,
        consumer.cached_info().config.max_deliver,
    );
    let gen_stream = if js_config.gen_is_stream {
        Some(gen_stream(&js, config, metrics).await)
    } else {
        None
    };
    // The cancels the server kept, before the first pull: a cancel
    // published while no worker ran is honoured too.
    let stream = &js_config.cancel_stream;
    let loaded = listen::load_kept(&js, stream, &intake, LOAD_BOUND).await?;
    tracing::info!(stream = %stream, loaded, "cancels kept by the server loaded");
    let sink = Sink::JetStream(Box::new(Publisher {
        client: client.clone(),
        js: js.clone(),
        confirmer: Confirmer::new(client.clone()),
    }));
    let durable = Pipeline {
        redelivery: Redelivery {
            nak_delay: Duration::from_millis(js_config.nak_delay_ms),
            max_deliver,
        },
        gen_stream,
        lookup_bound: ack_wait / 2,
        ..at_most_once(sink)
    };
    let drain_timeout = options.shutdown_timeout;
    let runner = Runner::new(durable, options);
    let puller = Puller {
        client: client.clone(),
        js: js.clone(),
        stream: js_config.prefill_stream.clone(),
        consumer: js_config.consumer.clone(),
        batch: js_config.batch,
        max_payload: config.max_payload_bytes,
        ack_wait,
        drain_timeout,
        ensure: Some(ensure_on_reopen(js, config, intake)),
        on_consuming: readiness.map(|readiness| {
            let on: jetstream::consume::OnConsuming =
                Arc::new(move |consuming| readiness.set_consuming(consuming));
            on
        }),
    };
    tracing::info!(
        stream = %js_config.prefill_stream,
        consumer = %js_config.consumer,
        ack_wait_ms = ack_wait.as_millis() as u64,
        "consuming from JetStream"
    );
    let source = jetstream::start(puller, consumer, runner.limits().clone());
    Ok(Worker {
        runner,
        source,
        _cancels: listener,
    })
}

/// What the pull loop runs before it opens the consumer again (after a
/// reconnect, or after the consumer vanished): with `jetstream.create`, the
/// setup, creating what is missing; then the cancels the server kept,
/// loaded again, as the live subscription may have missed some while the
/// connection was down.
fn ensure_on_reopen(
    js: async_nats::jetstream::Context,
    config: &Config,
    intake: listen::Intake,
) -> jetstream::consume::Ensure {
    let config = config.clone();
    Arc::new(move || {
        let (js, config, intake) = (js.clone(), config.clone(), intake.clone());
        Box::pin(async move {
            if config.jetstream.create {
                setup::ensure(&js, &config).await?;
            }
            let stream = &config.jetstream.cancel_stream;
            listen::load_kept(&js, stream, &intake, LOAD_BOUND).await?;
            Ok(())
        })
    })
}

/// [`start`], then [`Worker::run`] until `shutdown`; a shutdown during the
/// start returns an empty report.
pub async fn serve(
    client: Client,
    config: &Config,
    identity: Identity,
    metrics: Metrics,
    readiness: Option<Readiness>,
    shutdown: impl Future<Output = ()>,
) -> Result<Report, StartError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let worker = tokio::select! {
        worker = start(&client, config, identity, metrics, readiness, None) => worker?,
        () = shutdown.as_mut() => return Ok(Report {
            counts: super::Counts::default(),
            unfinished: 0,
            flushed: true,
        }),
    };
    Ok(worker.run(shutdown).await)
}

/// Opens the consumer (with `jetstream.create`, first creating what is
/// missing), waiting for a server that does not answer yet. Missing or
/// incompatible objects fail at once, and so does a request the server
/// refused for want of permissions: the server drops such a request, which
/// then times out like one to a server not ready yet, and says why only in
/// a permissions violation (`readiness` holds the last one).
async fn open_at_start(
    js: &async_nats::jetstream::Context,
    config: &Config,
    readiness: Option<&Readiness>,
) -> Result<async_nats::jetstream::consumer::PullConsumer, StartError> {
    let js_config = &config.jetstream;
    loop {
        let opened = async {
            if js_config.create {
                let report = setup::ensure(js, config).await?;
                for (object, change) in &report.objects {
                    if *change != setup::Change::Unchanged {
                        tracing::info!(%object, %change, "JetStream setup");
                    }
                }
            }
            let consumer =
                jetstream::open(js, &js_config.prefill_stream, &js_config.consumer).await?;
            jetstream::sweep::orphans(js, &js_config.prefill_stream, &js_config.consumer)
                .await
                .map_err(
                    |e| tracing::debug!(error = %e, "work-queue sweep failed; trying again later"),
                )
                .ok();
            Ok::<_, JetStreamError>(consumer)
        };
        match opened.await {
            Ok(consumer) => return Ok(consumer),
            Err(JetStreamError::Api(request)) => {
                let violation = readiness
                    .and_then(Readiness::permission_violation)
                    .filter(|v| v.contains("\"$JS."));
                if let Some(violation) = violation {
                    return Err(StartError::Denied { violation, request });
                }
                tracing::warn!(error = %request, "JetStream is not answering yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// How long loading the cancels the server kept may take.
const LOAD_BOUND: Duration = Duration::from_secs(30);

/// The GEN stream as the server holds it: its duplicate window, or the
/// configured one when it cannot be read (logged and counted: a result
/// redelivered after the real window but within the configured one is not
/// looked up in GEN, and could send a second decode job); whether it
/// expires messages by `Nats-TTL` (said once when it does not).
async fn gen_stream(
    js: &async_nats::jetstream::Context,
    config: &Config,
    metrics: &Metrics,
) -> GenStream {
    let js_config = &config.jetstream;
    let window = match duplicate_window(js, &js_config.gen_stream).await {
        Ok(window) => Some(window),
        Err(e) => {
            metrics.gen_window_lookup_failed();
            tracing::warn!(
                stream = %js_config.gen_stream,
                error = %e,
                "cannot read the GEN stream's duplicate window; using the configured one (jetstream.duplicate_window_secs), which must not be longer than the stream's"
            );
            None
        }
    };
    let msg_ttl = setup::msg_ttl_enabled(js, &js_config.gen_stream)
        .await
        .unwrap_or(false);
    if !msg_ttl {
        let version = js.client().server_info().version;
        let why = if setup::supports_msg_ttl(&version) {
            "its per-message TTL is off; `prefill-handoff setup` switches it on"
        } else {
            "nats-server before 2.11 has no per-message TTL"
        };
        tracing::info!(
            stream = %js_config.gen_stream,
            server = %version,
            "decode jobs past their deadline stay in the GEN stream until consumed: {why}"
        );
    }
    GenStream {
        msg_ttl,
        name: js_config.gen_stream.clone(),
        duplicate_window: window
            .or_else(|| setup::duplicate_window(config).ok())
            .unwrap_or(Duration::from_secs(js_config.duplicate_window_secs)),
    }
}

/// The duplicate window of the stream `name`, as the server holds it.
async fn duplicate_window(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> Result<Duration, String> {
    let mut stream = js.get_stream(name).await.map_err(|e| e.to_string())?;
    let info = stream.info().await.map_err(|e| e.to_string())?;
    Ok(info.config.duplicate_window)
}
