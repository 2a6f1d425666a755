//! The decision: one prefill result in, exactly one outcome out.
//!
//! [`decide`] is pure. It reads nothing but its arguments; the only effect it
//! may cause is asking the [`IdSource`] for a fresh request ID. `explain` is
//! this function plus printing; `run` is this function plus transports.

pub mod codes;
mod handoff;
pub mod reply;

pub use codes::{Backend, DeadLetterCode, ErrorCode, FinishReason};
pub use handoff::{backend_of, describe};
pub use reply::{Refusal, ReplyPolicy};

use crate::ids::MachineId;
use crate::wire::{self, Encoding, map, messages};
use rmpv::Value;

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
    pub gen_subject: String,
    pub dead_letter_subject: String,
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
    fn instance_id(&self) -> String;
    /// The slot held right now, if any.
    fn machine_id(&self) -> Option<MachineId>;
    /// A fresh request ID from the slot held right now. Fails while the worker
    /// holds no valid slot (fenced).
    fn mint(&mut self) -> Result<u64, IdentityUnavailable>;
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
    pub subject: String,
    /// Headers to set besides the trace headers copied by the transport.
    pub headers: Vec<(&'static str, String)>,
    pub payload: Vec<u8>,
    /// Frames after the first: they never change the outcome, only get counted.
    pub trailing_frames: usize,
    /// A human sentence for logs (error and dead-letter reasons).
    pub detail: Option<String>,
}

/// The longest accepted `request_id`, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// Decides what to publish for one prefill result (contract 4.2 and 4.3).
pub fn decide(input: Input<'_>, rules: &Rules, ids: &mut dyn IdSource) -> Decision {
    if input.payload.len() > rules.max_payload_bytes {
        return dead_letter(
            input,
            rules,
            DeadLetterCode::TooLarge,
            format!(
                "the message is {} bytes; at most {} are accepted (max_payload_bytes)",
                input.payload.len(),
                rules.max_payload_bytes
            ),
        );
    }
    let top = match wire::decode(input.payload, input.encoding) {
        Ok(Value::Map(top)) => top,
        Ok(other) => {
            let what = format!(
                "the body is {}; a prefill result is a map with request_id, reply_to and frames",
                describe(&other)
            );
            return dead_letter(input, rules, DeadLetterCode::Malformed, what);
        }
        Err(e) => {
            let what = format!("{e} (decoded as {})", input.encoding.as_str());
            return dead_letter(input, rules, DeadLetterCode::Malformed, what);
        }
    };
    let reply_to = match reply_subject(&top, input, rules) {
        Ok(subject) => subject,
        Err((code, why)) => return dead_letter(input, rules, code, why),
    };
    let reply = Reply {
        encoding: input.encoding,
        subject: reply_to,
        request_id: None,
    };
    match check_request(top) {
        Err(why) => reply.error(ErrorCode::Malformed, why, 0),
        Ok(request) => decide_request(request, reply, rules, ids),
    }
}

/// The parts of a well-formed prefill result.
struct Request {
    request_id: String,
    frames: Vec<Value>,
    rest: Vec<(Value, Value)>,
}

/// Where answers for a request go, once its reply subject is known.
struct Reply {
    encoding: Encoding,
    subject: String,
    request_id: Option<String>,
}

impl Reply {
    fn error(self, code: ErrorCode, message: String, trailing_frames: usize) -> Decision {
        let body = messages::error_response(self.request_id.as_deref(), code.as_str(), &message);
        Decision {
            outcome: Outcome::Error { code },
            payload: wire::encode(&body, self.encoding),
            headers: content_type(self.encoding),
            request_id: self.request_id,
            subject: self.subject,
            trailing_frames,
            detail: Some(message),
        }
    }
}

fn content_type(encoding: Encoding) -> Vec<(&'static str, String)> {
    encoding
        .content_type()
        .map(|ct| vec![("Content-Type", ct.to_string())])
        .unwrap_or_default()
}

fn reply_subject(
    top: &[(Value, Value)],
    input: Input<'_>,
    rules: &Rules,
) -> Result<String, (DeadLetterCode, String)> {
    let refused = |why: Refusal| (DeadLetterCode::ReplyToNotAllowed, why.to_string());
    let count = top
        .iter()
        .filter(|(k, _)| k.as_str() == Some("reply_to"))
        .count();
    if count > 1 {
        return Err((
            DeadLetterCode::Malformed,
            "the message holds reply_to more than once; it must appear once".into(),
        ));
    }
    let subject = match map::get_non_nil(top, "reply_to") {
        Some(Value::String(s)) => match s.as_str() {
            Some(s) => s.to_string(),
            None => {
                return Err((
                    DeadLetterCode::Malformed,
                    "reply_to is not valid UTF-8".into(),
                ));
            }
        },
        Some(other) => {
            return Err((
                DeadLetterCode::Malformed,
                format!(
                    "reply_to is {}; expected a NATS subject string",
                    describe(other)
                ),
            ));
        }
        None => match input.nats_reply.filter(|_| rules.use_nats_reply) {
            Some(s) => s.to_string(),
            None => {
                let why = if rules.use_nats_reply {
                    "the message has no reply_to field and no NATS reply subject"
                } else {
                    "the message has no reply_to field; in JetStream mode the reply subject must be in the body"
                };
                return Err((DeadLetterCode::MissingReplyTo, why.into()));
            }
        },
    };
    rules.reply_policy.check(&subject).map_err(refused)?;
    Ok(subject)
}

/// Checks the shape every result must have, once its reply subject is known.
fn check_request(mut top: Vec<(Value, Value)>) -> Result<Request, String> {
    if let Some(key) = map::duplicate_key(&top) {
        return Err(format!(
            "the message holds the key {key:?} more than once; each key must appear once"
        ));
    }
    let request_id = match map::get(&top, "request_id") {
        Some(Value::String(s)) => match s.as_str() {
            Some(id) if (1..=MAX_REQUEST_ID_BYTES).contains(&id.len()) => id.to_string(),
            Some(id) => {
                return Err(format!(
                    "request_id is {} bytes long; expected 1 to 256 bytes",
                    id.len()
                ));
            }
            None => return Err("request_id is not valid UTF-8".into()),
        },
        Some(other) => {
            return Err(format!(
                "request_id is {}; expected a string of 1 to 256 bytes",
                describe(other)
            ));
        }
        None => return Err("request_id is missing; expected a string of 1 to 256 bytes".into()),
    };
    let frames = match map::get(&top, "frames") {
        Some(Value::Array(frames)) => {
            if let Some(i) = frames.iter().position(|f| !f.is_map()) {
                return Err(format!(
                    "frame {i} is {}; every frame must be a map",
                    describe(&frames[i])
                ));
            }
            frames.len()
        }
        Some(other) => {
            return Err(format!(
                "frames is {}; expected an array of frame maps",
                describe(other)
            ));
        }
        None => return Err("frames is missing; expected an array of frame maps".into()),
    };
    if let Some(request) = map::get_non_nil(&top, "request")
        && !request.is_map()
    {
        return Err(format!("request is {}; expected a map", describe(request)));
    }
    let _ = frames;
    let frames = match take(&mut top, "frames") {
        Some(Value::Array(frames)) => frames,
        _ => Vec::new(),
    };
    Ok(Request {
        request_id,
        frames,
        rest: top,
    })
}

fn decide_request(
    mut request: Request,
    mut reply: Reply,
    rules: &Rules,
    ids: &mut dyn IdSource,
) -> Decision {
    reply.request_id = Some(request.request_id.clone());
    let trailing = request.frames.len().saturating_sub(1);
    let Some(Value::Map(mut first)) = request.frames.drain(..).next() else {
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
    if let Some(err) = map::get_non_nil(&first, "error") {
        let why = format!("the prefill worker reported an error: {}", error_text(err));
        return reply.error(ErrorCode::PrefillFailed, why, trailing);
    }
    let params = take(&mut first, "disaggregated_params");
    if let Some(reason) = map::get_non_nil(&first, "finish_reason")
        && !matches!(reason.as_str(), Some("length") | Some("not_finished"))
    {
        let finish_reason = match reason {
            Value::String(s) => FinishReason::from_label(s.as_str().unwrap_or("")),
            Value::Map(m) if map::has(m, "error") => FinishReason::Error,
            _ => FinishReason::Other,
        };
        let body = messages::terminal_response(&request.request_id, Value::Map(first));
        return Decision {
            outcome: Outcome::Terminal { finish_reason },
            payload: wire::encode(&body, reply.encoding),
            headers: content_type(reply.encoding),
            request_id: reply.request_id,
            subject: reply.subject,
            trailing_frames: trailing,
            detail: None,
        };
    }
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
    let outcome = Outcome::Decode {
        backend: handoff.backend,
        minted: handoff.minted,
    };
    let job = messages::DecodeJob {
        request_id: &request.request_id,
        reply_to: &reply.subject,
        backend: handoff.backend,
        disagg_request_id: handoff.disagg_request_id,
        handoff: handoff.params,
        prefill_output: first,
        request: take(&mut request.rest, "request").filter(|v| !v.is_nil()),
        instance_id: ids.instance_id(),
        machine_id: ids.machine_id(),
    };
    let mut headers = content_type(reply.encoding);
    headers.push(("Nats-Msg-Id", msg_id(&request.request_id)));
    Decision {
        outcome,
        payload: wire::encode(&job.into_value(), reply.encoding),
        headers,
        request_id: reply.request_id,
        subject: rules.gen_subject.clone(),
        trailing_frames: trailing,
        detail: None,
    }
}

fn dead_letter(input: Input<'_>, rules: &Rules, code: DeadLetterCode, why: String) -> Decision {
    Decision {
        outcome: Outcome::DeadLetter { code },
        request_id: None,
        subject: rules.dead_letter_subject.clone(),
        headers: vec![
            ("Handoff-Error-Code", code.as_str().to_string()),
            ("Handoff-Error", header_safe(&why)),
            ("Handoff-Source-Subject", header_safe(input.subject)),
        ],
        payload: input.payload.to_vec(),
        trailing_frames: 0,
        detail: Some(why),
    }
}

/// Removes a key from a map and returns its first value.
fn take(map: &mut Vec<(Value, Value)>, key: &str) -> Option<Value> {
    let i = map.iter().position(|(k, _)| k.as_str() == Some(key))?;
    let (_, v) = map.remove(i);
    Some(v)
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
    let text = text.unwrap_or_else(|| err.to_string());
    truncate(&text, 1024)
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The `Nats-Msg-Id` of a decode job: `handoff-{request_id}`, with bytes that
/// cannot stand in a header (control characters, `%`, non-ASCII) percent-encoded
/// so that distinct request IDs keep distinct message IDs.
pub fn msg_id(request_id: &str) -> String {
    let mut out = String::with_capacity(8 + request_id.len());
    out.push_str("handoff-");
    for b in request_id.bytes() {
        if (b' '..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A header value with control characters replaced, so that no input can
/// inject a header line.
fn header_safe(s: &str) -> String {
    let s = truncate(s, 1024);
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}
