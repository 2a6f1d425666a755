//! The decision: one prefill result in, exactly one outcome out.
//!
//! [`decide`] is pure. It reads nothing but its arguments; the only effect it
//! may cause is asking the [`IdSource`] for a fresh request ID. `explain` is
//! this function plus printing; `run` is this function plus transports.

pub mod codes;
mod complex;
mod fast;
mod handoff;
mod headers;
mod known;
pub mod reply;
mod request;
mod rules;
mod trace;

pub use crate::wire::messages::{Backend, InstanceId};
pub use codes::{DeadLetterCode, ErrorCode, FinishReason};
pub use complex::MAX_TREE_VALUES;
pub use handoff::{backend_of, describe};
pub use headers::{
    HEAD as HEADER_BLOCK_HEAD, Headers, PAYLOAD_OMITTED, content_type, dead_letter_headers, msg_id,
    push_line, without_payload,
};
pub use reply::{Refusal, ReplyPolicy};
pub use request::MAX_REQUEST_ID_BYTES;
pub use rules::RulesError;
pub use trace::{
    MAX_TRACESTATE_BYTES, TRACEPARENT, TRACEPARENT_LEN, TRACESTATE, TraceHeader, TraceHeaders,
    trace_headers,
};

use crate::ids::MachineId;
use crate::wire::{self, Encoding, map, messages};
use headers::{push_content_type, truncate};
use request::Request;
use rmpv::Value;
use std::sync::Arc;

/// One message as it arrived.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub payload: &'a [u8],
    /// From the `Content-Type` header.
    pub encoding: Encoding,
    /// The subject it arrived on (reported in dead letters).
    pub subject: &'a str,
    /// The NATS message's own reply subject. Used only when [`Rules::use_nats_reply`]
    /// is set (core mode) and the body has no `reply_to`.
    pub nats_reply: Option<&'a str>,
}

/// What a worker decides with: fixed for the worker's lifetime.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Shared, not copied, by every decision sent there.
    pub gen_subject: Arc<str>,
    pub dead_letter_subject: Arc<str>,
    pub reply_policy: ReplyPolicy,
    pub max_payload_bytes: usize,
    /// Core mode: fall back to the NATS reply subject when `reply_to` is absent.
    /// In JetStream mode the NATS reply subject is the ack subject, never a reply.
    pub use_nats_reply: bool,
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
    /// The GEN and dead-letter subjects are the rules' own, shared (a copy
    /// per decode job was an allocation and a copy per result).
    pub subject: Arc<str>,
    /// Headers to set besides the trace headers copied by the transport.
    pub headers: Headers,
    pub payload: Vec<u8>,
    /// Frames after the first: they never change the outcome, only get counted.
    pub trailing_frames: usize,
    /// A human sentence for logs (error and dead-letter reasons).
    pub detail: Option<String>,
}

/// Decides what to publish for one prefill result (contract 4.2 and 4.3).
///
/// Common MessagePack results are decided on the input's bytes in place (the
/// `fast` module); everything else, and all JSON, through value trees
/// ([`decide_values`]). Both give the same decision for every input the
/// tree path reads; a result holding more than [`MAX_TREE_VALUES`] values
/// that the in-place path declines is refused as `malformed` instead (see
/// `complex`), so no input costs more than a bounded tree.
pub fn decide(input: Input<'_>, rules: &Rules, ids: &mut dyn IdSource) -> Decision {
    if let Some(decision) = fast::decide(input, rules, ids) {
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
    fast::decide(input, rules, ids)
}

/// [`decide`] through value trees only: the reference the in-place path is
/// tested against.
pub fn decide_values(input: Input<'_>, rules: &Rules, ids: &mut dyn IdSource) -> Decision {
    if input.payload.len() > rules.max_payload_bytes {
        let why = format!(
            "the message is {} bytes; at most {} are accepted (max_payload_bytes)",
            input.payload.len(),
            rules.max_payload_bytes
        );
        return dead_letter(input, rules, DeadLetterCode::TooLarge, why);
    }
    let top = match wire::decode(input.payload, input.encoding) {
        Ok(Value::Map(top)) => top,
        Ok(other) => {
            let why = format!(
                "the body is {}; a prefill result is a map with request_id, reply_to and frames",
                describe(&other)
            );
            return dead_letter(input, rules, DeadLetterCode::Malformed, why);
        }
        Err(e) => {
            let why = format!("{e} (decoded as {})", input.encoding.as_str());
            return dead_letter(input, rules, DeadLetterCode::Malformed, why);
        }
    };
    let reply_to = match request::reply_subject(&top, input, rules) {
        Ok(subject) => subject,
        Err((code, why)) => return dead_letter(input, rules, code, why),
    };
    let mut reply = Reply {
        encoding: input.encoding,
        subject: reply_to,
        request_id: None,
        size_hint: input.payload.len(),
    };
    match request::check(top) {
        Err(malformed) => {
            reply.request_id = malformed.request_id;
            reply.error(ErrorCode::Malformed, malformed.why, 0)
        }
        Ok(request) => decide_request(request, reply, rules, ids),
    }
}

/// Where answers for a request go, once its reply subject is known.
struct Reply {
    encoding: Encoding,
    subject: String,
    request_id: Option<String>,
    /// The input's size: outputs are about as large.
    size_hint: usize,
}

impl Reply {
    fn error(self, code: ErrorCode, message: String, trailing_frames: usize) -> Decision {
        let body = messages::error_response(self.request_id.as_deref(), code.as_str(), &message);
        Decision {
            outcome: Outcome::Error { code },
            payload: wire::encode(&body, self.encoding),
            headers: content_type(self.encoding),
            request_id: self.request_id,
            subject: self.subject.into(),
            trailing_frames,
            detail: Some(message),
        }
    }
}

fn decide_request(
    request: Request,
    mut reply: Reply,
    rules: &Rules,
    ids: &mut dyn IdSource,
) -> Decision {
    let Request {
        request_id,
        frames,
        request,
        rest,
    } = request;
    reply.request_id = Some(request_id.clone());
    let trailing = frames.len().saturating_sub(1);
    // Rule 1. Only the first frame is ever looked at again; the rest are
    // counted (trailing) and dropped here.
    let Some(Value::Map(mut first)) = frames.into_iter().next() else {
        return reply.error(
            ErrorCode::NoOutput,
            "frames is empty; the prefill produced no output to decide on".into(),
            0,
        );
    };
    if let Some(key) = map::duplicate_key(&first) {
        let why = format!(
            "the first frame holds the key {key:?} more than once; each key must appear once"
        );
        return reply.error(ErrorCode::Malformed, why, trailing);
    }
    // Rule 2.
    if let Some(err) = map::get_non_nil(&first, "error") {
        let why = prefill_failed(&error_text(err));
        return reply.error(ErrorCode::PrefillFailed, why, trailing);
    }
    // The params never leave in a terminal response or a prefill_output.
    let params = map::take(&mut first, "disaggregated_params");
    // Rule 3.
    if let Some(reason) = map::get_non_nil(&first, "finish_reason")
        && !matches!(reason.as_str(), Some("length" | "not_finished"))
    {
        let finish_reason = match reason {
            Value::String(s) => FinishReason::from_label(s.as_str().unwrap_or("")),
            Value::Map(m) if map::has(m, "error") => FinishReason::Error,
            _ => FinishReason::Other,
        };
        let body = messages::terminal_response(&request_id, Value::Map(first));
        return Decision {
            outcome: Outcome::Terminal { finish_reason },
            payload: wire::encode_with_capacity(&body, reply.encoding, reply.size_hint),
            headers: content_type(reply.encoding),
            request_id: reply.request_id,
            subject: reply.subject.into(),
            trailing_frames: trailing,
            detail: None,
        };
    }
    // Rule 4.
    let params = match params {
        Some(Value::Map(params)) => params,
        other => {
            let why = format!(
                "the first frame needs decode (finish_reason {}) but disaggregated_params is {}; a decode handoff needs the engine's params map",
                map::get_non_nil(&first, "finish_reason").map_or_else(|| "absent".into(), describe),
                other.as_ref().map_or_else(|| "missing".into(), describe),
            );
            return reply.error(ErrorCode::NoDisaggregatedParams, why, trailing);
        }
    };
    let handoff = match handoff::validate(params, ids) {
        Ok(h) => h,
        Err((code, why)) => return reply.error(code, why, trailing),
    };
    // Rule 5.
    let outcome = Outcome::Decode {
        backend: handoff.backend,
        minted: handoff.minted.is_some(),
    };
    let (machine_id, instance_id) = match handoff.minted {
        Some(minted) => (minted.machine_id, minted.instance_id),
        None => (ids.machine_id(), ids.instance_id()),
    };
    let job = messages::DecodeJob {
        request_id: &request_id,
        reply_to: &reply.subject,
        backend: handoff.backend,
        disagg_request_id: handoff.disagg_request_id,
        handoff: handoff.params,
        prefill_output: first,
        request,
        instance_id,
        machine_id,
        extra: rest,
    };
    let mut headers = content_type(reply.encoding);
    headers.push("Nats-Msg-Id", &msg_id(&request_id));
    Decision {
        outcome,
        payload: wire::encode_with_capacity(
            &job.into_value(),
            reply.encoding,
            reply.size_hint + 128,
        ),
        headers,
        request_id: reply.request_id,
        subject: rules.gen_subject.clone(),
        trailing_frames: trailing,
        detail: None,
    }
}

/// The original bytes, unchanged, to the dead-letter subject. A JSON input
/// keeps its `Content-Type`, so the dead letter can be replayed as it is.
/// The decision for a message whose NATS header block could not be parsed
/// (`what` says what was wrong): a `malformed` dead letter, whatever its body,
/// since the headers it was sent with (content type, trace context) are
/// unknown. The transports recognize such a message
/// ([`crate::pipeline::decide::decide_now`]).
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
