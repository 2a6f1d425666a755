//! The decision: one prefill result in, exactly one outcome out.
//!
//! [`decide`] is pure. It reads nothing but its arguments; the only effect it
//! may cause is asking the [`IdSource`] for a fresh request ID. `explain` is
//! this function plus printing; `run` is this function plus transports.
//!
//! - `tree.rs`: the value-tree path, the reference; `fast.rs`: the same
//!   decision on the input's bytes in place, held to it by a differential
//!   property test; `fast_json.rs`: JSON read into what `fast.rs` reads,
//!   and its output written back as JSON, held to the reference the same
//!   way.
//! - [`deadline`]: deadlines and cancels, the one statement of their rules
//!   for both paths.

pub mod codes;
mod complex;
pub mod deadline;
mod fast;
mod fast_json;
mod handoff;
mod header_values;
mod known;
pub mod reply;
mod request;
mod rules;
mod tree;

pub use crate::wire::describe;
pub use crate::wire::messages::{Backend, InstanceId};
pub use codes::{DeadLetterCode, ErrorCode, FinishReason};
pub use complex::MAX_TREE_VALUES;
pub use deadline::{Cancelled, Cancels, NO_CANCELS, NoCancels};
pub use handoff::backend_of;
pub use header_values::{content_type, dead_letter_headers, without_payload};
pub use reply::{Refusal, ReplyPolicy};
pub use request::MAX_REQUEST_ID_BYTES;
pub use rules::RulesError;
pub use tree::decide_values;

use crate::config::{KvHoldConfig, MissingDisaggRequestId};
use crate::headers::Headers;
use crate::ids::MachineId;
use crate::wire::{self, Encoding, map};
use header_values::{push_content_type, truncate};
use rmpv::Value;
use std::sync::Arc;

/// One message as it arrived, and the moment it is decided at.
#[derive(Clone, Copy)]
pub struct Input<'a> {
    pub payload: &'a [u8],
    /// From the `Content-Type` header.
    pub encoding: Encoding,
    /// The subject it arrived on (reported in dead letters).
    pub subject: &'a str,
    /// The NATS message's own reply subject. Used only when [`Rules::use_nats_reply`]
    /// is set (core mode) and the body has no `reply_to`.
    pub nats_reply: Option<&'a str>,
    /// The first value of its `Handoff-Deadline` header, if any.
    pub deadline_header: Option<&'a str>,
    /// The first value of its `Handoff-KV-Expires` header, if any.
    pub kv_expires_header: Option<&'a str>,
    /// The wall-clock time of the decision, Unix epoch milliseconds:
    /// deadlines and KV expiries are compared with it.
    pub now_ms: u64,
    /// When the result was published, Unix epoch milliseconds, where the
    /// worker can know it (a JetStream stream's stored time), else when it
    /// was received: an engine's KV hold (`kv_hold_ms`) counts from it.
    pub published_ms: u64,
    /// The requests cancelled so far ([`NO_CANCELS`]: none).
    pub cancels: &'a dyn Cancels,
}

impl std::fmt::Debug for Input<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("payload", &self.payload.len())
            .field("encoding", &self.encoding)
            .field("subject", &self.subject)
            .field("nats_reply", &self.nats_reply)
            .field("deadline_header", &self.deadline_header)
            .field("kv_expires_header", &self.kv_expires_header)
            .field("now_ms", &self.now_ms)
            .field("published_ms", &self.published_ms)
            .finish_non_exhaustive()
    }
}

/// What a worker decides with: fixed for the worker's lifetime.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Shared, not copied, by every decision sent there.
    pub gen_subject: Arc<str>,
    pub dead_letter_subject: Arc<str>,
    /// Where KV release notices go (`subjects.kv_release`).
    pub release_subject: Arc<str>,
    /// How far a deadline may lie behind `now_ms` before it counts as
    /// passed (`deadline.clock_skew_ms`).
    pub deadline_skew_ms: u64,
    pub reply_policy: ReplyPolicy,
    pub max_payload_bytes: usize,
    /// Core mode: fall back to the NATS reply subject when `reply_to` is absent.
    /// In JetStream mode the NATS reply subject is the ack subject, never a reply.
    pub use_nats_reply: bool,
    /// What a TensorRT-LLM handoff without `disagg_request_id` gets
    /// (`trtllm.missing_disagg_request_id`).
    pub missing_disagg_request_id: MissingDisaggRequestId,
    /// Each engine's KV hold (`kv_hold_ms.*`), for results that do not say
    /// when their KV is freed.
    pub kv_hold_ms: KvHoldConfig,
}

impl Rules {
    /// When a `backend` handoff's KV is freed, for a result that does not
    /// say: its engine's hold after `published_ms`; `None` for a hold of 0
    /// (not known).
    pub fn kv_expiry(&self, backend: Backend, published_ms: u64) -> Option<u64> {
        let hold = match backend {
            Backend::Trtllm => self.kv_hold_ms.trtllm,
            Backend::Sglang => self.kv_hold_ms.sglang,
            Backend::Vllm => self.kv_hold_ms.vllm,
            Backend::Opaque => self.kv_hold_ms.opaque,
        };
        (hold > 0).then(|| published_ms.saturating_add(hold))
    }
}

/// Who is deciding: the worker's instance, and its ability to mint IDs.
/// Implemented by [`crate::identity::Identity`].
pub trait IdSource {
    /// The lease, as 16 hex digits.
    fn instance_id(&self) -> InstanceId;
    /// The slot held right now, if any.
    fn machine_id(&self) -> Option<MachineId>;
    /// A fresh request ID from the slot held right now. Fails while the worker
    /// holds no valid slot (fenced).
    fn mint(&mut self) -> Result<u64, IdentityUnavailable>;
    /// A fresh request ID and who minted it, as a decode job names them. The
    /// default asks [`IdSource::machine_id`] and [`IdSource::instance_id`]
    /// right after [`IdSource::mint`]; a source whose slot or lease can
    /// change between the calls should read all three under one lock
    /// ([`crate::identity::Identity`] does, which also takes one lock per
    /// minted handoff instead of two).
    fn mint_for_job(&mut self) -> Result<Minted, IdentityUnavailable> {
        let id = self.mint()?;
        Ok(Minted {
            id,
            machine_id: self.machine_id(),
            instance_id: self.instance_id(),
        })
    }
}

/// A request ID minted for a decode job, with the slot it was minted from
/// and the instance that minted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Minted {
    pub id: u64,
    pub machine_id: Option<MachineId>,
    pub instance_id: InstanceId,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct IdentityUnavailable(pub String);

/// What happened to one input, for metrics, logs and the JetStream ack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Decode { backend: Backend, minted: bool },
    Terminal { finish_reason: FinishReason },
    Error { code: ErrorCode },
    DeadLetter { code: DeadLetterCode },
}

impl Outcome {
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Decode { .. } => "decode",
            Outcome::Terminal { .. } => "terminal",
            Outcome::Error { .. } => "error",
            Outcome::DeadLetter { .. } => "dead_letter",
        }
    }
}

/// The one message to publish for an input.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub outcome: Outcome,
    /// The input's `request_id`, when it had a usable one.
    pub request_id: Option<String>,
    /// The GEN and dead-letter subjects are the rules' own, shared: a copy
    /// would be an allocation per result.
    pub subject: Arc<str>,
    /// Headers to set besides the trace headers copied from the input
    /// (`crate::headers::outgoing` puts them together).
    pub headers: Headers,
    pub payload: Vec<u8>,
    /// Frames after the first: they never change the outcome, only get counted.
    pub trailing_frames: usize,
    /// A human sentence for logs (error and dead-letter reasons).
    pub detail: Option<String>,
    /// The result's effective deadline, once its envelope was read.
    pub deadline_ms: Option<u64>,
    /// A decode job's: when its prefill engine frees the KV.
    pub kv_expires_ms: Option<u64>,
    /// The KV release notice published beside the one output, for a
    /// handoff refused after its parameters passed validation.
    pub release: Option<Box<Release>>,
}

/// A KV release notice, ready to publish: a side output, not the input's
/// one output.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    pub subject: Arc<str>,
    pub headers: Headers,
    pub payload: Vec<u8>,
}

/// Decides what to publish for one prefill result (contract 4.2 and 4.3).
///
/// Common results are decided without value trees (MessagePack on the
/// input's bytes in place, the `fast` module; JSON read token by token into
/// the same, `fast_json`); everything else through value trees
/// ([`decide_values`]). Both give the same decision for every input the
/// tree path reads; a result holding more than [`MAX_TREE_VALUES`] values
/// that the in-place path declines is refused as `malformed` instead (see
/// `complex`), so no input costs more than a bounded tree.
pub fn decide(input: Input<'_>, rules: &Rules, ids: &mut dyn IdSource) -> Decision {
    if let Some(decision) = decide_in_place(input, rules, ids) {
        return decision;
    }
    if input.payload.len() <= rules.max_payload_bytes
        && wire::more_values_than(input.payload, input.encoding, MAX_TREE_VALUES)
    {
        return complex::refuse(input, rules);
    }
    decide_values(input, rules, ids)
}

/// [`decide`] on the input's bytes in place, or `None` (with no ID minted)
/// when the input is not one of the cases handled that way.
pub fn decide_in_place(
    input: Input<'_>,
    rules: &Rules,
    ids: &mut dyn IdSource,
) -> Option<Decision> {
    match input.encoding {
        Encoding::MsgPack => fast::decide_msgpack(input, rules, ids),
        Encoding::Json => fast_json::decide(input, rules, ids),
    }
}

/// The original bytes, unchanged, to the dead-letter subject. A JSON input
/// keeps its `Content-Type`, so the dead letter can be replayed as it is.
/// The decision for a message whose NATS header block could not be parsed
/// (`what` says what was wrong): a `malformed` dead letter, whatever its body,
/// since the headers it was sent with (content type, trace context) are
/// unknown. The transports recognize such a message
/// ([`crate::headers::block_error`]).
pub fn unreadable_headers(input: Input<'_>, rules: &Rules, what: &str) -> Decision {
    let why = format!("the message's NATS header block could not be parsed: {what}");
    dead_letter(input, rules, DeadLetterCode::Malformed, why)
}

fn dead_letter(input: Input<'_>, rules: &Rules, code: DeadLetterCode, why: String) -> Decision {
    let mut headers = dead_letter_headers(code, &why, input.subject);
    push_content_type(&mut headers, input.encoding);
    Decision {
        outcome: Outcome::DeadLetter { code },
        request_id: None,
        subject: rules.dead_letter_subject.clone(),
        headers,
        payload: input.payload.to_vec(),
        trailing_frames: 0,
        detail: Some(why),
        deadline_ms: None,
        kv_expires_ms: None,
        release: None,
    }
}

/// The text of a frame's `error` field: the string itself, a map's `message`,
/// or a rendering of whatever else it is.
fn error_text(err: &Value) -> String {
    let text = match err {
        Value::String(s) => s.as_str().map(str::to_string),
        Value::Map(m) => map::get(m, "message")
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    };
    text.unwrap_or_else(|| err.to_string())
}

/// The message of a `prefill_failed` error response, from the text of the
/// frame's `error` (cut to 1 KiB).
fn prefill_failed(text: &str) -> String {
    format!(
        "the prefill worker reported an error: {}",
        truncate(text, 1024)
    )
}

/// The message of an `internal` error response: the worker could not write
/// its `output` for a result as JSON.
fn unwritable(output: &str, why: &wire::NotJson) -> String {
    format!(
        "the worker could not write the {output} for this result as JSON ({why}); the result is not at fault: this is a bug in prefill-handoff, please report it with the result"
    )
}
