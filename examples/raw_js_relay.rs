//! The JetStream ceiling: a durable pull consumer on a work-queue stream over
//! the prefill subject that publishes each message's bytes into the GEN stream
//! (waiting for the store ack) and then acks — the durable worker's I/O minus
//! the decision.
//!
//! ```text
//! cargo run --release --example raw_js_relay -- --nats-url nats://127.0.0.1:4222 --namespace llm
//! ```
//!
//! Creates `{NS}_PREFILL`, `{NS}_GEN` and the durable consumer `relay` when
//! missing. Prints `raw_js_relay: ready` on stderr once consuming.

use clap::Parser;
use prefill_handoff_loadgen::relay::{JsRelay, JsRelaySettings};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    #[arg(long, default_value = "llm")]
    namespace: String,
    /// Messages pulled per request.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Bytes pulled per request (async-nats' `max_bytes_per_batch`); 0 for
    /// no bound. The benchmark's stock-stream relay sets it to the
    /// worker's byte budget.
    #[arg(long, default_value_t = 0)]
    max_bytes: usize,
    /// Messages awaiting their GEN store ack at once.
    #[arg(long, default_value_t = 1024)]
    max_in_flight: usize,
    /// Memory storage instead of file storage for both streams.
    #[arg(long)]
    memory: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut settings = JsRelaySettings::for_namespace(&args.namespace);
    settings.batch = args.batch;
    settings.max_bytes = args.max_bytes;
    settings.max_in_flight = args.max_in_flight;
    settings.file_storage = !args.memory;
    let client = async_nats::ConnectOptions::new()
        .name("raw_js_relay")
        .connect(args.nats_url.as_str())
        .await?;
    let relay = JsRelay::start(client.clone(), settings.clone()).await?;
    let relayed = relay.relayed.clone();
    eprintln!(
        "raw_js_relay: ready, {} ({}) -> {} ({}), consumer {}",
        settings.prefill_subject,
        settings.prefill_stream,
        settings.gen_subject,
        settings.gen_stream,
        settings.consumer
    );
    let task = tokio::spawn(relay.run());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    task.abort();
    client.flush().await.ok();
    eprintln!("raw_js_relay: relayed {} messages", relayed.get());
    Ok(())
}
