//! The load generator behind `prefill-handoff loadgen`, and the raw relays the
//! worker's speed is compared with.
//!
//! A run publishes synthetic prefill results (contract 4.1) in a configurable
//! mix, listens on the GEN, reply and dead-letter subjects, matches every
//! output to its message by `request_id`, and reports throughput, latency and
//! any output that is missing, duplicated or of the wrong kind.
//!
//! - [`mix`]: the kinds of message and the output each must produce.
//! - [`payload`]: building the messages and their run-scoped request IDs.
//! - [`scan`] and [`tally`]: reading outputs cheaply and matching them.
//! - [`report`]: counts, throughput, percentiles; text and JSON.
//! - `driver`: the network side (subscribe, pace, publish, collect).
//! - [`relay`]: the raw core and JetStream relays (benchmark baselines).
//! - [`user_relay`]: the core relay as a user would write it (a second
//!   baseline).
//! - [`delay_proxy`]: a TCP proxy adding a fixed delay (the benchmark's round trip).
//! - [`cli`]: the `loadgen` command's flags, checked into [`Options`].
//!
//! A crate of its own, outside the worker's library: it speaks the contract
//! over NATS like any prefill worker would and needs nothing of the worker's
//! code. How to connect (URL, authentication, TLS) is the caller's: the
//! `prefill-handoff` binary builds [`Connect`] from the worker's `[nats]`
//! configuration, so loadgen connects exactly like `run`.

pub mod cli;
pub mod delay_proxy;
pub mod mix;
pub mod payload;
pub mod relay;
pub mod report;
pub mod scan;
pub mod tally;
pub mod user_relay;

mod driver;

pub use mix::{Kind, Mix, OutputKind};
pub use report::Report;

use std::time::Duration;

/// How to reach NATS: the servers and the client options (authentication,
/// TLS) the caller built. Each connection of a run starts from a clone of
/// `options` and adds its name, buffer sizes and event callback.
#[derive(Clone)]
pub struct Connect {
    pub servers: Vec<async_nats::ServerAddr>,
    pub options: async_nats::ConnectOptions,
    /// The server list as errors show it, without passwords or tokens.
    pub display: String,
}

// By hand: `ConnectOptions`' own Debug form could show credentials.
impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connect")
            .field("servers", &self.display)
            .finish_non_exhaustive()
    }
}

/// Everything a run needs; the CLI fills it from flags.
#[derive(Debug, Clone)]
pub struct Options {
    pub connect: Connect,
    pub prefill_subject: String,
    pub gen_subject: String,
    pub dead_letter_subject: String,
    /// Where the cancels of [`mix::Kind::Cancelled`] results go.
    pub cancel_subject: String,
    /// Where terminal and error responses come back: an allowed reply subject.
    pub reply_subject: String,
    /// A `reply_to` the worker must refuse, for dead-letter messages.
    pub refused_reply_to: String,
    /// One NATS subject token naming this run.
    pub run_id: String,
    pub count: usize,
    /// Messages per second; 0 = as fast as possible.
    pub rate: f64,
    pub mix: Mix,
    pub opaque_bytes: usize,
    /// Send JSON (`Content-Type: application/json`) instead of MessagePack.
    pub json: bool,
    /// Publish through JetStream and wait for the stream's acks.
    pub jetstream: bool,
    /// JetStream acks outstanding at once.
    pub concurrency: usize,
    /// Messages sent and answered before the measured window (not counted).
    pub warmup: usize,
    /// How long to wait for outputs after the last publish.
    pub timeout: Duration,
    /// How long to keep listening for duplicates once every output arrived.
    pub linger: Duration,
    /// Every message must come back unchanged on GEN (a raw relay).
    pub expect_relay: bool,
    /// Print a progress line to stderr about once a second.
    pub progress: bool,
}

impl Options {
    /// Defaults for a namespace (contract 2 subject names) and a run.
    pub fn new(connect: Connect, ns: &str, run_id: &str) -> Options {
        Options {
            connect,
            prefill_subject: format!("{ns}.prefill.results"),
            gen_subject: format!("{ns}.gen.jobs"),
            dead_letter_subject: format!("{ns}.handoff.dead"),
            cancel_subject: format!("{ns}.handoff.cancel"),
            reply_subject: format!("{ns}.replies.loadgen.{run_id}"),
            refused_reply_to: format!("$SYS.loadgen.{run_id}"),
            run_id: run_id.to_string(),
            count: 10_000,
            rate: 0.0,
            mix: Mix::default(),
            opaque_bytes: 256,
            json: false,
            jetstream: false,
            concurrency: 1024,
            warmup: 0,
            timeout: Duration::from_secs(10),
            linger: Duration::from_millis(250),
            expect_relay: false,
            progress: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    #[error("NATS: {0}")]
    Nats(String),
}

/// Runs one load test. The report says whether every output arrived once.
pub async fn run(opts: &Options) -> Result<Report, LoadgenError> {
    driver::run(opts).await
}

/// A fresh run ID: 8 hex digits, a single subject token.
pub fn new_run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    format!("{:08x}", h.finish() as u32)
}
