//! `prefill-handoff run`: configuration, logging, the etcd identity, the NATS
//! transport and the worker loop, then an orderly shutdown.

use super::ConfigArgs;
use crate::config::{Config, Mode};
use crate::identity::{Lease, Registration};
use crate::metrics::Metrics;
use crate::transport::{self, Inbound, Outbound, core::CoreInbound};
use crate::worker::{Options, Worker, shutdown::Signals};
use anyhow::Context;

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref(), &overrides(&args))?;
    // Rules are checked before anything touches the network: a bad allowlist
    // is a config error (exit 2), not a runtime one.
    let rules = config.rules()?;
    init_logging(&config);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("handoff")
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(serve(config, rules));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

async fn serve(config: Config, rules: crate::decision::Rules) -> anyhow::Result<()> {
    let mut signals = Signals::install().context("cannot install the SIGTERM/SIGINT handlers")?;
    let metrics = Metrics::new();
    let registration = Registration {
        subjects: config.own_subjects(),
    };
    let lease = Lease::start(&config, registration)
        .await
        .context("cannot obtain an etcd lease and machine-ID slot")?;
    let identity = lease.identity();
    let state = identity.state();
    tracing::info!(
        instance_id = %crate::wire::messages::instance_id(state.lease_id.unwrap_or(0)),
        machine_id = state.machine_id.map(|m| m.get()),
        "identity held"
    );

    let started = start(&config, rules, identity, metrics).await;
    let (worker, inbound) = match started {
        Ok(parts) => parts,
        Err(e) => {
            lease.shutdown().await;
            return Err(e);
        }
    };
    tracing::info!(
        mode = ?config.mode,
        subjects = %config.subjects.prefill_results,
        queue_group = %config.queue_group,
        max_in_flight = config.max_in_flight,
        "consuming prefill results"
    );
    let report = worker
        .run(inbound, async move {
            let name = signals.recv().await;
            tracing::info!(signal = name, "shutdown requested");
        })
        .await;
    tracing::info!("shutdown: revoking the etcd lease (frees the machine-ID slot)");
    lease.shutdown().await;
    tracing::info!(
        unfinished = report.unfinished,
        flushed = report.flushed,
        "shutdown complete"
    );
    Ok(())
}

async fn start(
    config: &Config,
    rules: crate::decision::Rules,
    identity: crate::identity::Identity,
    metrics: Metrics,
) -> anyhow::Result<(Worker, Inbound)> {
    let client = transport::connect(&config.nats, metrics.clone()).await?;
    let inbound = match config.mode {
        Mode::Core => Inbound::Core(
            CoreInbound::subscribe(&client, &config.prefill_subjects(), &config.queue_group)
                .await?,
        ),
        Mode::Jetstream => anyhow::bail!("mode = \"jetstream\" is not built yet"),
    };
    let worker = Worker::new(
        rules,
        identity,
        metrics,
        Outbound::new(client),
        Options::from_config(config),
    );
    Ok((worker, inbound))
}

/// The flags as `key=value` overrides (flag beats environment beats file).
fn overrides(args: &ConfigArgs) -> Vec<(String, String)> {
    let flags = [
        ("nats.url", &args.nats_url),
        ("etcd.endpoints", &args.etcd_endpoints),
        ("namespace", &args.namespace),
        ("mode", &args.mode),
        ("metrics_addr", &args.metrics_addr),
        ("lease_ttl_secs", &args.lease_ttl_secs),
        ("shutdown_timeout_secs", &args.shutdown_timeout_secs),
        ("id_layout", &args.id_layout),
    ];
    let mut out: Vec<(String, String)> = flags
        .into_iter()
        .filter_map(|(key, value)| value.clone().map(|v| (key.to_string(), v)))
        .collect();
    for pair in &args.set {
        if let Some((key, value)) = pair.split_once('=') {
            out.push((key.trim().to_string(), value.to_string()));
        }
    }
    out
}

fn init_logging(config: &Config) {
    let _ = config;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
