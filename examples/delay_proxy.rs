//! A TCP proxy adding a fixed one-way delay in each direction, for the
//! benchmark's runs at a round trip (`scripts/bench.sh`, `*-rtt`):
//!
//! ```text
//! cargo run --release --example delay_proxy -- --listen 127.0.0.1:14222 \
//!     --upstream 127.0.0.1:4222 --delay-us 500
//! ```
//!
//! A 500 µs one-way delay is a 1 ms round trip. Prints
//! `delay_proxy: listening` on stderr once accepting.

use clap::Parser;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

#[derive(Parser)]
struct Args {
    /// Where clients connect.
    #[arg(long)]
    listen: SocketAddr,
    /// The server relayed to.
    #[arg(long)]
    upstream: SocketAddr,
    /// One-way delay added in each direction, in microseconds.
    #[arg(long, default_value_t = 500)]
    delay_us: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(args.listen)?;
    eprintln!(
        "delay_proxy: listening on {}, relaying to {} with {} µs each way",
        args.listen, args.upstream, args.delay_us
    );
    prefill_handoff_loadgen::delay_proxy::serve(
        listener,
        args.upstream,
        Duration::from_micros(args.delay_us),
    )?;
    Ok(())
}
