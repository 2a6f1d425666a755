//! The core NATS ceiling: queue-subscribe to the prefill subject and
//! republish every message's bytes unchanged to GEN. No decoding, no decision.
//!
//! ```text
//! cargo run --release --example raw_relay -- --nats-url nats://127.0.0.1:4222 --namespace llm
//! ```
//!
//! Prints `raw_relay: ready` on stderr once subscribed; stops on SIGTERM or
//! Ctrl-C after draining the subscription.

use clap::Parser;
use prefill_handoff_loadgen::relay::CoreRelay;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    #[arg(long, default_value = "llm")]
    namespace: String,
    /// [default: {ns}.prefill.results]
    #[arg(long)]
    from: Option<String>,
    /// [default: {ns}.gen.jobs]
    #[arg(long)]
    to: Option<String>,
    /// [default: {ns}-handoff, the worker's queue group]
    #[arg(long)]
    queue: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ns = &args.namespace;
    let from = args.from.unwrap_or_else(|| format!("{ns}.prefill.results"));
    let to = args.to.unwrap_or_else(|| format!("{ns}.gen.jobs"));
    let queue = args.queue.unwrap_or_else(|| format!("{ns}-handoff"));
    // Same client-side buffer as a worker tuned for bursts would use.
    let client = async_nats::ConnectOptions::new()
        .name("raw_relay")
        .subscription_capacity(1 << 20)
        .connect(args.nats_url.as_str())
        .await?;
    let relay = CoreRelay::start(client.clone(), &from, Some(&queue), &to).await?;
    let relayed = relay.relayed.clone();
    eprintln!("raw_relay: ready, {from} -> {to} (queue {queue})");
    let task = tokio::spawn(relay.run());
    shutdown_signal().await;
    // Bounded: with the server gone, a drain waits for a reconnect forever.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), client.drain()).await;
    let _ = task.await;
    eprintln!("raw_relay: relayed {} messages", relayed.get());
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
