//! `prefill-handoff loadgen`: publish synthetic prefill results, report what
//! came back. Exits 0 only when every output arrived exactly once.
//!
//! The `prefill-handoff` binary parses these flags, reads the worker's
//! `[nats]` configuration named by `--config`, `--set` and `--nats-url` into
//! a [`Connect`], and calls [`run`].

use crate::{Connect, LoadgenError, Mix, Options};
use std::time::Duration;

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The flags ask for something impossible (exit code 2).
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Run(#[from] LoadgenError),
    /// The run ended, but not every output arrived exactly once.
    #[error("loadgen: {0}")]
    Incomplete(String),
    #[error("printing the report: {0}")]
    Print(#[from] serde_json::Error),
}

#[derive(Debug, clap::Args)]
pub struct LoadgenArgs {
    /// NATS server URL(s), comma-separated [default: `nats.url` of the
    /// configuration: --set, HANDOFF_NATS__URL, --config, nats://127.0.0.1:4222].
    #[arg(long)]
    pub nats_url: Option<String>,
    /// TOML configuration file; loadgen connects with its `[nats]` section
    /// (URL, authentication, TLS), like the worker.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Any configuration key: `--set key=value` (repeatable), e.g.
    /// `--set nats.tls.ca_file=/etc/ca.pem`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Namespace `{ns}` for the default subject names.
    #[arg(long, env = "HANDOFF_NAMESPACE", default_value = "llm")]
    pub namespace: String,
    /// Where to publish prefill results [default: {ns}.prefill.results].
    #[arg(long)]
    pub prefill_subject: Option<String>,
    /// Where decode jobs arrive [default: {ns}.gen.jobs].
    #[arg(long)]
    pub gen_subject: Option<String>,
    /// Where dead letters arrive [default: {ns}.handoff.dead].
    #[arg(long)]
    pub dead_letter_subject: Option<String>,
    /// Measured messages to send.
    #[arg(long, default_value_t = 10_000)]
    pub count: usize,
    /// Messages per second; 0 = as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Kinds and weights: trtllm, sglang, vllm, opaque, terminal, error, dead.
    #[arg(long, default_value = "trtllm=80,terminal=15,error=5")]
    pub mix: String,
    /// Size of TensorRT-LLM's opaque_state (MessagePack binary).
    #[arg(long, default_value_t = 256)]
    pub opaque_bytes: usize,
    /// Send JSON results (`Content-Type: application/json`; opaque_state as
    /// base64) instead of MessagePack.
    #[arg(long)]
    pub json_results: bool,
    /// Publish through JetStream and await each stream ack (durable mode).
    #[arg(long)]
    pub jetstream: bool,
    /// JetStream publishes awaiting their ack at once.
    #[arg(long, default_value_t = 1024)]
    pub concurrency: usize,
    /// Messages sent and answered before the measured window (not counted).
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// Seconds to wait for outputs after the last publish.
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
    /// Milliseconds to keep listening for duplicates once all outputs arrived.
    #[arg(long, default_value_t = 250)]
    pub linger_ms: u64,
    /// Expect every message back unchanged on GEN (raw relay baselines).
    #[arg(long)]
    pub expect_relay: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Run ID used in request IDs and the reply subject [default: random].
    #[arg(long)]
    pub run_id: Option<String>,
}

/// Runs the load test the flags ask for and prints its report.
pub async fn run(args: &LoadgenArgs, connect: Connect) -> Result<(), CliError> {
    let opts = options(args, connect)?;
    let report = crate::run(&opts).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    match report.failure() {
        None => Ok(()),
        Some(why) => Err(CliError::Incomplete(why)),
    }
}

/// The run the flags ask for, or why they make no sense.
pub fn options(args: &LoadgenArgs, connect: Connect) -> Result<Options, CliError> {
    let usage = CliError::Usage;
    let mix: Mix = args.mix.parse().map_err(|e| usage(format!("{e}")))?;
    if !(args.rate >= 0.0 && args.rate.is_finite()) {
        return Err(usage(format!(
            "--rate {}: expected messages per second, 0 for as fast as possible",
            args.rate
        )));
    }
    if !(args.timeout >= 0.0 && args.timeout.is_finite()) {
        return Err(usage(format!(
            "--timeout {}: expected seconds",
            args.timeout
        )));
    }
    if args.count == 0 {
        return Err(usage("--count 0: send at least one message".into()));
    }
    let valid_token = |s: &str| {
        !s.is_empty()
            && !s
                .bytes()
                .any(|b| matches!(b, b'.' | b'*' | b'>' | b' ' | b'\t' | b'\r' | b'\n'))
    };
    if !valid_token(&args.namespace) {
        return Err(usage(format!(
            "--namespace {:?}: expected one subject token (no dots, wildcards or spaces)",
            args.namespace
        )));
    }
    let run_id = args.run_id.clone().unwrap_or_else(crate::new_run_id);
    if !valid_token(&run_id) {
        return Err(usage(format!(
            "--run-id {run_id:?}: expected one subject token (no dots, wildcards or spaces)"
        )));
    }
    let mut opts = Options::new(connect, &args.namespace, &run_id);
    if let Some(s) = &args.prefill_subject {
        opts.prefill_subject = s.clone();
    }
    if let Some(s) = &args.gen_subject {
        opts.gen_subject = s.clone();
    }
    if let Some(s) = &args.dead_letter_subject {
        opts.dead_letter_subject = s.clone();
    }
    opts.count = args.count;
    opts.rate = args.rate;
    opts.mix = mix;
    opts.opaque_bytes = args.opaque_bytes;
    opts.json = args.json_results;
    opts.jetstream = args.jetstream;
    opts.concurrency = args.concurrency;
    opts.warmup = args.warmup;
    opts.timeout = Duration::from_secs_f64(args.timeout);
    opts.linger = Duration::from_millis(args.linger_ms);
    opts.expect_relay = args.expect_relay;
    opts.progress = !args.quiet;
    Ok(opts)
}
