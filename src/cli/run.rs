//! `prefill-handoff run`: configuration, logging, the etcd identity, the NATS
//! transport, the metrics server, the ID mint service and the worker loop,
//! then an orderly shutdown (contract 5): drain, finish, flush, revoke, exit 0.

use super::ConfigArgs;
use super::load::{JetStreamObjects, LoadError, Loaded};
use super::supervise::{self, Stopped};
use crate::config::Config;
use crate::id_service::{self, IdService};
use crate::identity::{Identity, Lease, LeaseError, Registration};
use crate::metrics::{self, Metrics, Readiness};
use crate::pipeline::serve::{StartError, Worker};
use crate::pipeline::shutdown::Signals;
use crate::setup::JetStreamError;
use crate::telemetry::Telemetry;
use anyhow::Context;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    // Every section is checked before anything touches the network: a bad
    // value is a config error (exit 2), not a runtime one.
    let loaded = args.load_checked(JetStreamObjects::WhenJetStreamMode)?;
    super::logging::init(&loaded.config.log_format);
    super::supervise::exit_on_panic();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_name("handoff");
    if let Some(threads) = pool_threads() {
        builder.worker_threads(threads);
    }
    let runtime = builder.build().context("cannot start the async runtime")?;
    // The worker runs as a task in the pool, not on `block_on`'s thread: see
    // `pool_threads`.
    let result = runtime.block_on(async {
        tokio::spawn(give_back_freed_memory());
        tokio::spawn(serve(loaded))
            .await
            .unwrap_or_else(|e| Err(anyhow::Error::new(e).context("the worker's task failed")))
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// The runtime's pool: one thread, which runs the whole worker (the NATS
/// connection task, the intake, the batches, etcd, metrics). A result then
/// goes from the socket to the decision and back to the connection without
/// crossing a thread: no futex wake-up and no context switch per hand-off.
///
/// The alternative, the worker loop on a thread of its own beside the pool,
/// costs a futex wake-up or a context switch for a good share of results
/// and more CPU per result (`docs/performance.md`).
///
/// One thread decides ~200,000 typical results per second, far beyond what
/// a node's prefill workers produce. Large results (`pipeline::decide`) are
/// still decided beside it: `block_in_place` hands this thread's other tasks
/// to a fresh thread meanwhile, so the connection keeps reading.
/// `TOKIO_WORKER_THREADS`, when set, decides instead (`None`: tokio reads it).
fn pool_threads() -> Option<usize> {
    if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
        return None;
    }
    Some(1)
}

/// Every [`crate::alloc::GIVE_BACK_EVERY`], on the pool's thread (whose
/// pages hold nearly all of a burst's memory), lets mimalloc give back what
/// a burst freed and the worker has not used again for
/// [`crate::alloc::KEEP_FREED_MS`]. Runs until the runtime shuts down.
async fn give_back_freed_memory() {
    // The first tick one period in: at start there is nothing to give back.
    let every = crate::alloc::GIVE_BACK_EVERY;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        crate::alloc::give_back_freed_memory();
    }
}

async fn serve(loaded: Loaded) -> anyhow::Result<()> {
    let Loaded {
        config,
        otel,
        id_service,
        ..
    } = loaded;
    let mut signals = Signals::install().context("cannot install the SIGTERM/SIGINT handlers")?;
    let metrics = Metrics::new();
    let telemetry = otel
        .map(|settings| Telemetry::start(settings, &metrics))
        .transpose()?;
    // Startup waits on etcd and NATS; a signal meanwhile stops it cleanly.
    let Some(lease) = until_signal(&mut signals, hold_identity(&config)).await else {
        return Ok(());
    };
    let lease = lease?;
    let identity = lease.identity();
    metrics.watch_identity(identity.watch());
    if let Some(telemetry) = &telemetry {
        telemetry.watch_identity(identity.watch());
    }
    let readiness = Readiness::new(identity.watch());

    let (stop_http, http_stopped) = oneshot::channel::<()>();
    let started = start(
        &config,
        id_service,
        identity,
        telemetry.clone(),
        &metrics,
        &readiness,
        http_stopped,
    );
    let started = match until_signal(&mut signals, started).await {
        Some(Ok(started)) => started,
        Some(Err(e)) => {
            lease.shutdown().await;
            return Err(e);
        }
        None => {
            lease.shutdown().await;
            return Ok(());
        }
    };
    readiness.set_consuming(true);
    tracing::info!(
        mode = ?config.mode,
        subjects = %config.subjects.prefill_results,
        queue_group = %config.queue_group,
        max_in_flight = config.max_in_flight,
        "consuming prefill results"
    );
    let result = consume(started, signals, &readiness).await;
    if let Some(telemetry) = &telemetry {
        // Bounded: a dead collector delays the exit by one export timeout.
        tracing::info!("shutdown: exporting the spans still queued");
        telemetry
            .shutdown(telemetry.settings().export_timeout)
            .await;
    }
    tracing::info!("shutdown: revoking the etcd lease (frees the machine-ID slot)");
    lease.shutdown().await;
    let _ = stop_http.send(());
    tracing::info!("shutdown complete");
    result
}

/// The etcd lease and machine-ID slot. A bad `id_epoch` or unusable etcd TLS
/// files are config errors (exit 2); etcd unreachable or all 1021 slots
/// taken, exit 1.
async fn hold_identity(config: &Config) -> anyhow::Result<Lease> {
    let registration = Registration {
        subjects: config.own_subjects(),
    };
    let lease = match Lease::start(config, registration).await {
        Ok(lease) => lease,
        Err(LeaseError::Config(e)) => return Err(LoadError::from(e).into()),
        Err(LeaseError::Security(e)) => return Err(LoadError::from(e).into()),
        Err(e) => {
            return Err(
                anyhow::Error::new(e).context("cannot obtain an etcd lease and machine-ID slot")
            );
        }
    };
    let state = lease.identity().state();
    tracing::info!(
        instance_id = %crate::wire::messages::instance_id(state.lease_id.unwrap_or(0)),
        machine_id = state.machine_id.map(|m| m.get()),
        "identity held"
    );
    Ok(lease)
}

/// Runs the worker until a signal asks it to stop, its NATS client can
/// never work again, or it stops taking input on its own; then stops the
/// ID service.
async fn consume(
    started: Started,
    mut signals: Signals,
    readiness: &Readiness,
) -> anyhow::Result<()> {
    let draining = readiness.clone();
    let requested = Arc::new(AtomicBool::new(false));
    let asked = requested.clone();
    // The signals are awaited in a task of their own, and the worker loop
    // waits on a oneshot: the runner's loop polls its shutdown future once
    // or twice per result at a moderate rate, and the two signal streams
    // with their `Notify` cost far more per poll than a oneshot's flag.
    let (requested_tx, requested_rx) = oneshot::channel::<()>();
    let signal_task = tokio::spawn(async move {
        let name = signals.recv().await;
        tracing::info!(signal = name, "shutdown requested");
        asked.store(true, Ordering::Relaxed);
        draining.set_consuming(false);
        let _ = requested_tx.send(());
    });
    let shutdown = async move {
        // An error (the task ended without sending) cannot happen short of
        // a panic, which ends the process (`supervise::exit_on_panic`).
        let _ = requested_rx.await;
    };
    let Started {
        worker,
        client,
        closed,
        id_service,
    } = started;
    supervise::debug_fault(&client);
    let work = async {
        let report = worker.run(shutdown).await;
        tracing::info!(
            unfinished = report.unfinished,
            flushed = report.flushed,
            "worker loop stopped"
        );
    };
    // Supervision (supervise.rs): a worker whose NATS client can never work
    // again, or that stopped taking input on its own, must not exit 0 or stay
    // up idle: not ready at once, then out with an error.
    let result = tokio::select! {
        () = work => match requested.load(Ordering::Relaxed) {
            true => Ok(()),
            false => Err(stopped(readiness, Stopped::InputEnded)),
        },
        () = closed.wait() => Err(stopped(readiness, Stopped::ConnectionEnded)),
    };
    id_service.abort();
    signal_task.abort();
    result
}

/// The worker stopped working on its own: not ready from now on, and an
/// error, so the process exits 1 and is restarted.
fn stopped(readiness: &Readiness, why: Stopped) -> anyhow::Error {
    readiness.set_nats_connected(false);
    readiness.set_consuming(false);
    tracing::error!(error = %why, "exiting with an error so that the service manager restarts the worker");
    why.into()
}

/// A start failure: a config error exits 2, anything else 1. (Both config
/// errors are checked at load; these arms keep the exit code right should
/// one get here.)
fn start_error(e: StartError) -> anyhow::Error {
    match e {
        StartError::Rules(e) => LoadError::from(e).into(),
        StartError::JetStream(JetStreamError::Wanted(e)) => LoadError::from(e).into(),
        other => anyhow::Error::new(other),
    }
}

/// Runs `startup` unless SIGTERM or SIGINT comes first (`None`).
async fn until_signal<T>(signals: &mut Signals, startup: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        result = startup => Some(result),
        name = signals.recv() => {
            tracing::info!(signal = name, "shutdown requested during startup");
            None
        }
    }
}

/// What runs once the identity is held.
struct Started {
    worker: Worker,
    client: async_nats::Client,
    closed: crate::connect::Closed,
    id_service: tokio::task::JoinHandle<()>,
}

async fn start(
    config: &Config,
    id_service: IdService,
    identity: Identity,
    telemetry: Option<Telemetry>,
    metrics: &Metrics,
    readiness: &Readiness,
    http_stopped: oneshot::Receiver<()>,
) -> anyhow::Result<Started> {
    metrics::serve(
        &config.metrics_addr,
        metrics.clone(),
        readiness.clone(),
        async move {
            let _ = http_stopped.await;
        },
    )
    .await?;
    let (client, closed) =
        crate::connect::connect_watched(&config.nats, metrics.clone(), readiness.clone()).await?;
    let id_service = id_service::serve(
        client.clone(),
        id_service,
        identity.clone(),
        metrics.clone(),
    )
    .await?;
    // Consuming starts last: the ID service answers before results come.
    let worker = crate::pipeline::serve::start(
        &client,
        config,
        identity,
        metrics.clone(),
        Some(readiness.clone()),
        telemetry,
    )
    .await
    .map_err(start_error)?;
    Ok(Started {
        worker,
        client,
        closed,
        id_service,
    })
}
