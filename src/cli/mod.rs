//! The `prefill-handoff` command line (contract 8): the worker's commands.
//! The binary (src/main.rs) adds `loadgen` from the load generator's crate.
//!
//! Exit codes: 0 success, 2 usage or config error, 1 anything else.

mod explain;
mod ids;
pub mod load;
pub mod logging;
mod run;
mod setup;
mod slots;
mod supervise;

use crate::config::{Config, ConfigError};
use clap::{Args, Parser, Subcommand};
use load::{JetStreamObjects, LoadError, Loaded};
use std::path::PathBuf;

/// What `prefill-handoff --help` says the program does.
pub const ABOUT: &str = "Hands prefill results to decode: one output per result.";

#[derive(Debug, Parser)]
#[command(
    name = "prefill-handoff",
    version,
    about = ABOUT
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the worker.
    Run(ConfigArgs),
    /// Create the JetStream streams and consumer (idempotent).
    Setup(ConfigArgs),
    /// Print what `run` would publish for one prefill result. No network.
    ///
    /// The configuration is read as `run` reads it: defaults, `--config`,
    /// `HANDOFF_*` variables, then flags; its subjects, reply allowlist,
    /// size limit, mode and ID layout apply.
    Explain(explain::ExplainArgs),
    /// Mint request IDs for a machine ID. No network.
    MintId(ids::MintArgs),
    /// Split a request ID into its fields. No network.
    DecodeId(ids::DecodeArgs),
    /// List claimed machine-ID slots and live instances from etcd.
    Slots(slots::SlotsArgs),
    /// Print every configuration key as Markdown (docs/configuration.md).
    ///
    /// Key, type, default, environment variable, range and meaning, from
    /// the key table in the code; docs/configuration.md is this output.
    ConfigReference,
}

/// Flags that override configuration keys; every key can also be set in the
/// file or by a `HANDOFF_*` variable (flag beats environment beats file).
#[derive(Debug, Clone, Default, Args)]
pub struct ConfigArgs {
    /// TOML configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// NATS server URL(s), comma-separated (`nats.url`).
    #[arg(long)]
    pub nats_url: Option<String>,
    /// etcd endpoints, comma-separated (`etcd.endpoints`).
    #[arg(long)]
    pub etcd_endpoints: Option<String>,
    /// Namespace `{ns}` for default subject and key names.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Delivery mode: `core` or `jetstream`.
    #[arg(long, value_name = "core|jetstream")]
    pub mode: Option<String>,
    /// Metrics and health HTTP address.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Lease TTL in seconds.
    #[arg(long)]
    pub lease_ttl_secs: Option<String>,
    /// Shutdown timeout in seconds.
    #[arg(long)]
    pub shutdown_timeout_secs: Option<String>,
    /// ID layout: `rc21` or `rc22`.
    #[arg(long, alias = "layout", value_name = "rc21|rc22")]
    pub id_layout: Option<String>,
    /// Any other key: `--set key=value` (repeatable), e.g. `--set subjects.gen=llm.gen.jobs`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl ConfigArgs {
    /// The flags as `key=value` overrides: every `--set`, in order, then the
    /// dedicated flags (which therefore win over a `--set` of the same key).
    pub fn overrides(&self) -> Result<Vec<(String, String)>, LoadError> {
        let mut out = Vec::new();
        for pair in &self.set {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| LoadError::SetPair { pair: pair.clone() })?;
            out.push((key.trim().to_string(), value.to_string()));
        }
        let named = [
            ("nats.url", &self.nats_url),
            ("etcd.endpoints", &self.etcd_endpoints),
            ("namespace", &self.namespace),
            ("mode", &self.mode),
            ("metrics_addr", &self.metrics_addr),
            ("lease_ttl_secs", &self.lease_ttl_secs),
            ("shutdown_timeout_secs", &self.shutdown_timeout_secs),
            ("id_layout", &self.id_layout),
        ];
        for (key, value) in named {
            if let Some(value) = value {
                out.push((key.to_string(), value.clone()));
            }
        }
        Ok(out)
    }

    /// The configuration these flags select: defaults, `--config`, the
    /// process's `HANDOFF_*` environment, then the flags. Only the
    /// configuration's own checks: see [`ConfigArgs::load_checked`].
    pub fn load(&self) -> Result<Config, LoadError> {
        Ok(Config::load(self.config.as_deref(), &self.overrides()?)?)
    }

    /// [`ConfigArgs::load`], then every section checked by the subsystem
    /// that owns it, with the process's `OTEL_*` variables.
    pub fn load_checked(&self, jetstream: JetStreamObjects) -> Result<Loaded, LoadError> {
        Loaded::check(self.load()?, jetstream, |name| std::env::var(name).ok())
    }
}

/// An error the user caused by how they called the command: exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The command line parsed, or the exit code when it cannot be (2) or asked
/// only for `--help` or `--version` (0, after printing them).
pub fn parse<P: Parser>() -> Result<P, i32> {
    P::try_parse().map_err(|e| {
        let code = if e.use_stderr() { 2 } else { 0 };
        let _ = e.print();
        code
    })
}

/// The exit code for a command's result, after printing its error.
pub fn exit_code(result: anyhow::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("prefill-handoff: {e:#}");
            if e.downcast_ref::<UsageError>().is_some()
                || e.downcast_ref::<LoadError>().is_some()
                || e.downcast_ref::<ConfigError>().is_some()
            {
                2
            } else {
                1
            }
        }
    }
}

/// Runs one of the worker's commands.
pub fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => run::run(args),
        Command::Setup(args) => setup::run(args),
        Command::Explain(args) => explain::run(args),
        Command::MintId(args) => ids::mint(args),
        Command::DecodeId(args) => ids::decode(args),
        Command::Slots(args) => slots::run(args),
        Command::ConfigReference => {
            print!("{}", crate::config::reference_markdown());
            Ok(())
        }
    }
}
