//! The value-tree path of the decision: the reference the in-place path
//! (`fast`) is held to, and the path for everything that one declines (all
//! JSON, non-canonical MessagePack, rare errors). Contract 4.2 and 10, in
//! their order.

use super::handoff;
use super::request::{self, Request};
use super::{
    Backend, DeadLetterCode, Decision, ErrorCode, FinishReason, IdSource, Input, Outcome, Release,
    Rules, content_type, dead_letter, deadline, error_text, prefill_failed, unwritable,
};
use crate::headers::names::NATS_MSG_ID;
use crate::headers::release_msg_id;
use crate::wire::{self, Encoding, describe, map, messages};
use rmpv::Value;

/// [`super::decide`] through value trees only: the reference the in-place path is
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
        deadline_ms: None,
        kv_expires_ms: None,
    };
    match request::check(top) {
        Err(malformed) => {
            reply.request_id = malformed.request_id;
            reply.error(ErrorCode::Malformed, malformed.why, 0)
        }
        Ok(request) => decide_frames(request, reply, input, rules, ids),
    }
}

/// Where answers for a request go, once its reply subject is known.
pub(super) struct Reply {
    pub(super) encoding: Encoding,
    pub(super) subject: String,
    pub(super) request_id: Option<String>,
    /// The input's size: outputs are about as large.
    pub(super) size_hint: usize,
    /// The result's effective deadline, once read.
    pub(super) deadline_ms: Option<u64>,
    /// When its KV is freed, as the result says (field or header), once read.
    pub(super) kv_expires_ms: Option<u64>,
}

impl Reply {
    pub(super) fn error(
        self,
        code: ErrorCode,
        message: String,
        trailing_frames: usize,
    ) -> Decision {
        let body = messages::error_response(self.request_id.as_deref(), code.as_str(), &message);
        Decision {
            outcome: Outcome::Error { code },
            payload: wire::encode(&body, self.encoding),
            headers: content_type(self.encoding),
            request_id: self.request_id,
            subject: self.subject.into(),
            trailing_frames,
            detail: Some(message),
            deadline_ms: self.deadline_ms,
            kv_expires_ms: None,
            release: None,
        }
    }

    /// The terminal response `body`; `internal` when it cannot be written.
    fn terminal(self, body: &Value, finish_reason: FinishReason, trailing: usize) -> Decision {
        let payload = match wire::try_encode(body, self.encoding, self.size_hint) {
            Ok(payload) => payload,
            Err(e) => {
                let why = unwritable("terminal response", &e);
                return self.error(ErrorCode::Internal, why, trailing);
            }
        };
        Decision {
            outcome: Outcome::Terminal { finish_reason },
            payload,
            headers: content_type(self.encoding),
            request_id: self.request_id,
            subject: self.subject.into(),
            trailing_frames: trailing,
            detail: None,
            deadline_ms: self.deadline_ms,
            kv_expires_ms: None,
            release: None,
        }
    }

    /// The error response for a handoff refused after its parameters passed
    /// validation, with its KV release notice.
    fn refused(
        self,
        (code, message): (ErrorCode, String),
        handoff: Handoff<'_>,
        rules: &Rules,
        trailing_frames: usize,
    ) -> Decision {
        let notice = messages::release_notice(
            handoff.request_id,
            code.as_str(),
            handoff.backend,
            Value::Map(handoff.params),
            handoff.ids.instance_id(),
            handoff.ids.machine_id(),
        );
        let payload = match wire::try_encode(&notice, self.encoding, 256) {
            Ok(payload) => payload,
            Err(e) => {
                let why = unwritable("KV release notice", &e);
                return self.error(ErrorCode::Internal, why, trailing_frames);
            }
        };
        let mut headers = content_type(self.encoding);
        headers.push(NATS_MSG_ID, &release_msg_id(handoff.request_id));
        let release = Release {
            subject: rules.release_subject.clone(),
            headers,
            payload,
        };
        Decision {
            release: Some(Box::new(release)),
            ..self.error(code, message, trailing_frames)
        }
    }
}

/// A refused handoff, as its release notice names it.
struct Handoff<'a> {
    request_id: &'a str,
    backend: Backend,
    /// The engine's params as received.
    params: Vec<(Value, Value)>,
    ids: &'a dyn IdSource,
}

/// What a decode job is made of, once rules 1 to 3 let a result through.
struct JobParts {
    request_id: String,
    /// The first frame, without its `disaggregated_params`.
    first: Vec<(Value, Value)>,
    /// The first frame's `disaggregated_params`, as it came.
    params: Option<Value>,
    request: Option<Value>,
    rest: Vec<(Value, Value)>,
    trailing: usize,
}

/// The deadline and rules 1 to 3 for a result whose envelope is well formed
/// (an error response or a terminal response), then rules 4 and 5
/// ([`decide_handoff`]).
fn decide_frames(
    request: Request,
    mut reply: Reply,
    input: Input<'_>,
    rules: &Rules,
    ids: &mut dyn IdSource,
) -> Decision {
    let Request {
        request_id,
        frames,
        request,
        mut rest,
    } = request;
    reply.request_id = Some(request_id.clone());
    // The deadline (contract 10): the job carries the effective one in its
    // own field, so the input's is not passed on as it came.
    let field = map::take(&mut rest, "deadline_ms");
    match deadline::effective(deadline::Field::of(field.as_ref()), input.deadline_header) {
        Ok(ms) => reply.deadline_ms = ms,
        Err(why) => return reply.error(ErrorCode::InvalidDeadline, why, 0),
    }
    // The KV's expiry likewise: the job carries the effective one.
    let field = map::take(&mut rest, "kv_expires_ms");
    match deadline::kv_expires(deadline::Field::of(field.as_ref()), input.kv_expires_header) {
        Ok(ms) => reply.kv_expires_ms = ms,
        Err(why) => return reply.error(ErrorCode::InvalidKvExpires, why, 0),
    }
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
        return reply.terminal(&body, finish_reason, trailing);
    }
    let parts = JobParts {
        request_id,
        first,
        params,
        request,
        rest,
        trailing,
    };
    decide_handoff(parts, reply, input, rules, ids)
}

/// Rules 4 and 5: the handoff checked (or refused, by a deadline or a
/// cancel), its request ID minted when it needs one, and the decode job.
fn decide_handoff(
    mut parts: JobParts,
    reply: Reply,
    input: Input<'_>,
    rules: &Rules,
    ids: &mut dyn IdSource,
) -> Decision {
    let trailing = parts.trailing;
    // Rule 4.
    let params = match parts.params.take() {
        Some(Value::Map(params)) => params,
        other => {
            let why = format!(
                "the first frame needs decode (finish_reason {}) but disaggregated_params is {}; a decode handoff needs the engine's params map",
                map::get_non_nil(&parts.first, "finish_reason")
                    .map_or_else(|| "absent".into(), describe),
                other.as_ref().map_or_else(|| "missing".into(), describe),
            );
            return reply.error(ErrorCode::NoDisaggregatedParams, why, trailing);
        }
    };
    let (backend, kept) = match handoff::check(&params) {
        Ok(checked) => checked,
        Err((code, why)) => return reply.error(code, why, trailing),
    };
    let pending = handoff::Pending {
        request_id: &parts.request_id,
        backend,
        deadline: reply.deadline_ms,
        kv_expires: reply.kv_expires_ms,
        kept,
    };
    let (kv_expires, disagg) = handoff::admit(pending, input, rules, ids);
    match disagg {
        Ok(disagg) => {
            let handoff = handoff::complete(params, backend, disagg);
            decode_job(parts, handoff, kv_expires, reply, rules, ids)
        }
        Err(refusal) => {
            let handoff = Handoff {
                request_id: &parts.request_id,
                backend,
                params,
                ids,
            };
            reply.refused(refusal, handoff, rules, trailing)
        }
    }
}

/// Rule 5: the decode job, to GEN.
fn decode_job(
    parts: JobParts,
    handoff: handoff::Handoff,
    kv_expires_ms: Option<u64>,
    reply: Reply,
    rules: &Rules,
    ids: &dyn IdSource,
) -> Decision {
    let JobParts {
        request_id,
        first,
        request,
        rest,
        trailing,
        ..
    } = parts;
    let outcome = Outcome::Decode {
        backend: handoff.backend,
        minted: handoff.minted.is_some(),
    };
    let trtllm = handoff.backend == Backend::Trtllm;
    let (machine_id, instance_id) = match handoff.minted {
        Some(minted) => (minted.machine_id, minted.instance_id),
        None => (ids.machine_id(), ids.instance_id()),
    };
    let job = messages::DecodeJob {
        request_id: &request_id,
        reply_to: &reply.subject,
        backend: handoff.backend,
        disagg_request_id: trtllm.then_some(handoff.disagg_request_id),
        handoff: handoff.params,
        prefill_output: first,
        request,
        instance_id,
        machine_id,
        deadline_ms: reply.deadline_ms,
        kv_expires_ms,
        extra: rest,
    };
    let payload = match wire::try_encode(&job.into_value(), reply.encoding, reply.size_hint + 128) {
        Ok(payload) => payload,
        Err(e) => {
            let why = unwritable("decode job", &e);
            return reply.error(ErrorCode::Internal, why, trailing);
        }
    };
    let mut headers = content_type(reply.encoding);
    headers.add_job(&request_id, reply.deadline_ms, kv_expires_ms);
    Decision {
        outcome,
        payload,
        headers,
        request_id: reply.request_id,
        subject: rules.gen_subject.clone(),
        trailing_frames: trailing,
        detail: None,
        deadline_ms: reply.deadline_ms,
        kv_expires_ms,
        release: None,
    }
}
