//! The core relay as a user of async-nats would write it
//! (`prefill_handoff_loadgen::user_relay`): default connect options,
//! tokio's default runtime, one `publish` per message.
//!
//! ```text
//! cargo run --release --example user_relay -- --nats-url nats://127.0.0.1:4222 --namespace llm
//! ```
//!
//! Prints `user_relay: ready` on stderr once subscribed; stops on SIGTERM or
//! Ctrl-C.

use clap::Parser;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    #[arg(long, default_value = "llm")]
    namespace: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ns = &args.namespace;
    let from = format!("{ns}.prefill.results");
    let to = format!("{ns}.gen.jobs");
    let queue = format!("{ns}-handoff");
    let client = async_nats::connect(args.nats_url.as_str()).await?;
    eprintln!("user_relay: ready, {from} -> {to} (queue {queue})");
    let relay = prefill_handoff_loadgen::user_relay::run(client, from, queue, to);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        relayed = relay => eprintln!("user_relay: relayed {} messages", relayed.map_err(|e| anyhow::anyhow!(e))?),
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
