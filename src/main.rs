//! The `prefill-handoff` binary: the worker's commands (`prefill_handoff::cli`)
//! and `loadgen`, the load generator of the `prefill-handoff-loadgen` crate.
//! The library holds no load-generator code; this file is where the two meet
//! (the workspace Cargo.toml says why the cut is here).

// As in src/lib.rs: a function over 80 lines says why it is not split.
#![warn(clippy::too_many_lines)]

use clap::{Parser, Subcommand};
use prefill_handoff::cli::{self, ConfigArgs, UsageError};
use prefill_handoff::config::{self, nats_url};
use prefill_handoff::connect::auth_options;
use prefill_handoff_loadgen::{Connect, cli::CliError, cli::LoadgenArgs};

// mimalloc: the worker allocates and frees a few buffers per message on every
// runtime thread; it is faster and keeps a lower peak RSS than the system
// allocator for that pattern (src/alloc.rs says how it is tuned).
#[global_allocator]
static ALLOCATOR: prefill_handoff::alloc::MiMalloc = prefill_handoff::alloc::MiMalloc;

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
    // Freed memory is kept a minute for the next burst, not mimalloc's
    // second (`alloc::KEEP_FREED_MS` says what it saves and costs; `run`
    // asks mimalloc to give it back after that). MIMALLOC_PURGE_DELAY, when
    // set, decides instead. A delay of 0, giving freed memory back at once,
    // costs much more CPU per message in bursts (page faults and TLB
    // shootdowns) and, with results read in place, does not lower the peak
    // of a hostile burst of large results either.
    prefill_handoff::alloc::keep_freed_memory();
    // No transparent huge pages for this process, whatever the host's
    // setting. mimalloc's `no_thp` feature (Cargo.toml) only stops it asking
    // for them (MADV_HUGEPAGE); on a host set to THP "always" the kernel
    // would still back its large regions with 2 MiB pages, each zeroed on
    // its first touch: a large share of the worker's CPU in a burst and a
    // peak RSS rounded up to those pages (`docs/performance.md`). mimalloc does the same prctl itself only when its allow_thp
    // option is off before it initializes, which is before main.
    // SAFETY: prctl with PR_SET_THP_DISABLE takes integer arguments only;
    // a kernel without it returns an error, which changes nothing.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
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
