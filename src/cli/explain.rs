//! `prefill-handoff explain`: the decision plus printing. No network.
//!
//! Loads the configuration as `run` does (defaults, `--config`, `HANDOFF_*`,
//! flags), reads one prefill result and prints what `run` would publish for
//! it with that configuration:
//! `{"outcome", "subject", "headers", "message", ...}`, where `message` is
//! the published body rendered as JSON (for a dead letter: the original
//! bytes, as JSON when they parse, else as a string).

use super::load::LoadError;
use super::{ConfigArgs, UsageError};
use crate::decision::{self, Decision, Input, Outcome, Rules};
use crate::identity::Identity;
use crate::ids::MachineId;
use crate::wire::{self, Encoding};
use anyhow::Context;
use serde_json::{Map, Value as Json, json};
use std::io::Read;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// File holding one prefill result; standard input when absent or `-`.
    pub file: Option<PathBuf>,
    /// The input is MessagePack (default: JSON).
    #[arg(long)]
    pub msgpack: bool,
    /// Machine ID to mint `disagg_request_id` with, in [0, 1021).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub machine_id: i64,
    /// The NATS message's own reply subject, as core mode would see it.
    #[arg(long, value_name = "SUBJECT")]
    pub nats_reply: Option<String>,
    /// The configuration whose rules apply, as `run` reads it: the subjects,
    /// the reply allowlist, the size limit, the mode and the ID layout.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The value of the message's `Handoff-Deadline` header.
    #[arg(long, value_name = "MS")]
    pub deadline_header: Option<String>,
    /// The value of the message's `Handoff-KV-Expires` header.
    #[arg(long, value_name = "MS")]
    pub kv_expires_header: Option<String>,
    /// The time of the decision, Unix epoch milliseconds (default: now):
    /// deadlines and KV expiries are compared with it.
    #[arg(long, value_name = "MS")]
    pub now_ms: Option<u64>,
    /// When the result was published, Unix epoch milliseconds (default: the
    /// decision's time): an engine's `kv_hold_ms` counts from it.
    #[arg(long, value_name = "MS")]
    pub published_ms: Option<u64>,
    /// A request ID to treat as cancelled (repeatable).
    #[arg(long = "cancelled", value_name = "REQUEST_ID")]
    pub cancelled: Vec<String>,
}

/// The request IDs given with `--cancelled`.
struct Listed(Vec<String>);

impl decision::Cancels for Listed {
    fn lookup(&self, request_id: &str, _: u64) -> Option<decision::Cancelled> {
        self.0
            .iter()
            .any(|id| id == request_id)
            .then(decision::Cancelled::default)
    }
}

pub fn run(args: ExplainArgs) -> anyhow::Result<()> {
    let machine_id = MachineId::new(i128::from(args.machine_id))
        .map_err(|e| UsageError(format!("--machine-id: {e}")))?;
    // Only the sections the decision uses: explain runs anywhere, also
    // where the worker's TLS files are not.
    let config = args.config.load()?;
    let rules = Rules::from_config(&config).map_err(LoadError::from)?;
    let epoch = config.epoch_unix_ms().map_err(LoadError::from)?;
    let mut identity = Identity::fixed(config.id_layout, epoch, machine_id);

    let payload = read_input(args.file.as_ref(), rules.max_payload_bytes)?;
    let encoding = if args.msgpack {
        Encoding::MsgPack
    } else {
        Encoding::Json
    };
    let source = config
        .prefill_subjects()
        .into_iter()
        .next()
        .unwrap_or_default();
    let cancels = Listed(args.cancelled);
    let now_ms = args.now_ms.unwrap_or_else(crate::clock::unix_ms);
    let input = Input {
        payload: &payload,
        encoding,
        subject: &source,
        nats_reply: args.nats_reply.as_deref(),
        deadline_header: args.deadline_header.as_deref(),
        kv_expires_header: args.kv_expires_header.as_deref(),
        now_ms,
        published_ms: args.published_ms.unwrap_or(now_ms),
        cancels: &cancels,
    };
    let d = decision::decide(input, &rules, &mut identity);
    let report = render(&d, &payload, encoding);
    let text = serde_json::to_string_pretty(&report).context("rendering the outcome")?;
    println!("{text}");
    Ok(())
}

/// Reads at most `max + 1` bytes: enough to tell that an input is too large
/// without holding all of it.
fn read_input(file: Option<&PathBuf>, max: usize) -> anyhow::Result<Vec<u8>> {
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let mut payload = Vec::new();
    match file.filter(|f| f.as_os_str() != "-") {
        Some(path) => std::fs::File::open(path)
            .and_then(|f| f.take(limit).read_to_end(&mut payload))
            .with_context(|| format!("reading {}", path.display()))?,
        None => std::io::stdin()
            .lock()
            .take(limit)
            .read_to_end(&mut payload)
            .context("reading standard input")?,
    };
    Ok(payload)
}

/// The printed outcome: what `run` would publish, where, with which headers.
pub fn render(d: &Decision, input: &[u8], encoding: Encoding) -> Json {
    let mut out = Map::new();
    out.insert("outcome".into(), json!(d.outcome.kind()));
    out.insert("subject".into(), json!(&*d.subject));
    match &d.outcome {
        Outcome::Decode { backend, minted } => {
            out.insert("backend".into(), json!(backend.as_str()));
            out.insert("minted".into(), json!(minted));
        }
        Outcome::Terminal { finish_reason } => {
            out.insert("finish_reason".into(), json!(finish_reason.as_str()));
        }
        Outcome::Error { code } => {
            out.insert("code".into(), json!(code.as_str()));
        }
        Outcome::DeadLetter { code } => {
            out.insert("code".into(), json!(code.as_str()));
        }
    }
    if let Some(detail) = &d.detail {
        out.insert("detail".into(), json!(detail));
    }
    if let Some(ms) = d.deadline_ms {
        out.insert("deadline_ms".into(), json!(ms));
    }
    if let Some(ms) = d.kv_expires_ms {
        out.insert("kv_expires_ms".into(), json!(ms));
    }
    out.insert("headers".into(), headers_json(&d.headers));
    let published = if matches!(d.outcome, Outcome::DeadLetter { .. }) {
        input
    } else {
        &d.payload
    };
    let message = match wire::decode(published, encoding) {
        Ok(value) => wire::to_json(&value),
        Err(_) => json!(String::from_utf8_lossy(published)),
    };
    out.insert("message".into(), message);
    if let Some(release) = &d.release {
        let message = wire::decode(&release.payload, encoding)
            .map_or_else(|_| Json::Null, |value| wire::to_json(&value));
        out.insert(
            "release".into(),
            json!({
                "subject": &*release.subject,
                "headers": headers_json(&release.headers),
                "message": message,
            }),
        );
    }
    Json::Object(out)
}

fn headers_json(headers: &crate::headers::Headers) -> Json {
    Json::Object(
        headers
            .iter()
            .map(|(name, value)| (name.to_string(), json!(value)))
            .collect(),
    )
}
