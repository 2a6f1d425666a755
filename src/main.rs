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

// mimalloc's `mi_option_set` (from the mimalloc library `mimalloc` links in;
// libmimalloc-sys declares it only behind its `extended` feature).
unsafe extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// `mi_option_purge_delay` in `mi_option_e` (mimalloc v2 and v3 include/mimalloc.h
/// of libmimalloc-sys 0.1.49): milliseconds before freed memory is given back
/// to the OS (default 10, and 10 times that for arenas).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

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
    // Give freed memory back at once. A burst of 2,000 results of 1 MiB
    // (tests/server/worker_bounds.rs, nats-server 2.9.10, debug build) peaked at
    // 209-214 MiB with the default delay and 132 MiB without: results are
    // allocated by the NATS connection's thread and freed on others, and the
    // delayed purges kept ~80 MiB of them resident against the 256 MiB limit.
    // SAFETY: called first thing, before any other thread exists (the
    // function is not thread safe); an unknown option is ignored.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    // No transparent huge pages for this process, whatever the host's
    // setting. mimalloc's `no_thp` feature (Cargo.toml) only stops it asking
    // for them (MADV_HUGEPAGE); on a host set to THP "always" the kernel
    // would still back its large regions with 2 MiB pages, each zeroed on
    // its first touch: 13-24% of the worker's CPU in a 50,000-message burst
    // (perf, clear_page_erms) and peak RSS rounded up (97 -> 56 MB with THP
    // off). mimalloc does the same prctl itself only when its allow_thp
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
