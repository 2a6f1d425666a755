//! The `prefill-handoff` binary: the worker's commands (`prefill_handoff::cli`)
//! and `loadgen`, the load generator of the `prefill-handoff-loadgen` crate.
//! The library holds no load-generator code; this file is where the two meet
//! (the workspace Cargo.toml says why the cut is here).

use clap::{Parser, Subcommand};
use prefill_handoff::cli::{self, ConfigArgs, UsageError};
use prefill_handoff::config::{self, nats_url};
use prefill_handoff::connect::auth_options;
use prefill_handoff_loadgen::{Connect, cli::CliError, cli::LoadgenArgs};

// mimalloc: the worker allocates and frees a few buffers per message on every
// runtime thread; measured faster and with a lower peak RSS than the system
// allocator (see the benchmark notes in the README).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "prefill-handoff", version, about = cli::ABOUT)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Worker(cli::Command),
    /// Publish synthetic prefill results and report throughput and latency.
    Loadgen(LoadgenArgs),
}

fn main() {
    let code = match cli::parse::<Cli>() {
        Ok(Cli {
            command: Command::Worker(command),
        }) => cli::exit_code(cli::dispatch(command)),
        Ok(Cli {
            command: Command::Loadgen(args),
        }) => cli::exit_code(loadgen(args)),
        Err(code) => code,
    };
    std::process::exit(code);
}

/// `loadgen`, connecting with the worker's `[nats]` settings (URL,
/// authentication, TLS) from the same layers as `run`: `--set`, then
/// `--nats-url`, over `HANDOFF_*` and `--config`.
fn loadgen(args: LoadgenArgs) -> anyhow::Result<()> {
    let nats = ConfigArgs {
        config: args.config.clone(),
        nats_url: args.nats_url.clone(),
        set: args.set.clone(),
        ..Default::default()
    }
    .load()
    .map_err(|e| UsageError(e.to_string()))?
    .nats;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let servers = nats_url::parse(&nats.url)?;
        let options = auth_options(
            async_nats::ConnectOptions::new(),
            &nats,
            servers.credentials,
        )
        .await?;
        let connect = Connect {
            servers: servers.addrs,
            options,
            display: config::redact_urls(&nats.url),
        };
        prefill_handoff_loadgen::cli::run(&args, connect)
            .await
            .map_err(|e| match e {
                CliError::Usage(why) => UsageError(why).into(),
                other => anyhow::Error::new(other),
            })
    })
}
