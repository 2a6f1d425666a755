//! The in-place decision for JSON results: serde_json reads the body into
//! the MessagePack `fast` decides on (`wire::json_to_msgpack`), converting
//! the values `fast` reads and carrying every other value as its JSON text,
//! and the outputs `fast` writes are written back as JSON
//! (`wire::msgpack_to_json`), carried values as they came. No value tree of
//! the result is built.
//!
//! The decision is the value-tree path's: `fast` decides on what the
//! value-tree path's JSON decode would hold, and the outputs are what that
//! path writes, except that the values only copied keep the producer's
//! JSON text (its spacing, escapes and number forms) where that path
//! writes them compactly; the headers are set as that path sets them.
//! Everything `fast` declines, and every body serde_json refuses, returns
//! `None` before any side effect; the caller takes the value-tree path,
//! which describes the problem.

use super::header_values::content_type;
use super::known::{ENGINE_READS, Key};
use super::{
    DeadLetterCode, Decision, ErrorCode, IdSource, Input, Outcome, Rules, dead_letter, fast,
    unwritable,
};
use crate::headers::names::NATS_MSG_ID;
use crate::headers::release_msg_id;
use crate::wire::{
    self, Encoding, Field, NotJson, json_to_msgpack, messages, msgpack_to_json, scan,
};

const TOP: u8 = 0;
const FRAME: u8 = 1;
const PARAMS: u8 = 2;
/// The params' `kv_transfer_params` (Dynamo's nesting of vLLM's).
const NESTED: u8 = 3;
/// `request`: copied whole by `fast`, but checked to be a map.
const REQUEST: u8 = 4;

/// What `fast` reads of a result: the envelope, the first frame's reason
/// and error, the params the engine checks read. A value it reads that
/// came carried would make it decline (an ext value is no string, number,
/// map or nil to it), never answer differently.
fn plan(level: u8, key: &str) -> Field {
    match (level, Key::named(key.as_bytes())) {
        (TOP, Key::RequestId | Key::ReplyTo | Key::DeadlineMs | Key::KvExpiresMs)
        | (FRAME, Key::Error | Key::FinishReason) => Field::Read,
        (TOP, Key::Frames) => Field::Objects(FRAME),
        (TOP, Key::Request) => Field::Object(REQUEST),
        (FRAME, Key::DisaggregatedParams) => Field::Object(PARAMS),
        (PARAMS, Key::KvTransferParams) => Field::Object(NESTED),
        (PARAMS | NESTED, key) if key.is_in(ENGINE_READS) => Field::Read,
        _ => Field::Copied,
    }
}

/// The decision for a JSON `input`, or `None` when the value-tree path must
/// decide.
pub(super) fn decide(input: Input<'_>, rules: &Rules, ids: &mut dyn IdSource) -> Option<Decision> {
    if input.encoding != Encoding::Json || input.payload.len() > rules.max_payload_bytes {
        return None;
    }
    let body = json_to_msgpack(input.payload, plan)?;
    let as_msgpack = Input {
        payload: &body,
        encoding: Encoding::MsgPack,
        ..input
    };
    let decision = fast::decide_msgpack(as_msgpack, rules, ids)?;
    // An ID may be minted by now: whatever happens next, this path answers.
    Some(written_back(decision, &body, input, rules))
}

/// `decision`'s outputs written back as JSON, with their JSON headers; or,
/// when one of them holds what JSON cannot carry, an `internal` error
/// response in their place (no release notice: its bytes are what could
/// not be written, or beside an output that could not be).
fn written_back(mut decision: Decision, body: &[u8], input: Input<'_>, rules: &Rules) -> Decision {
    // An output is about as large as its input (JSON is the larger form),
    // plus the job's own fields.
    let capacity = input.payload.len() + 512;
    let release = match &decision.release {
        Some(release) => msgpack_to_json(&release.payload, release.payload.len() * 2).map(Some),
        None => Ok(None),
    };
    let (payload, release_payload) = match (msgpack_to_json(&decision.payload, capacity), release) {
        (Ok(payload), Ok(release)) => (payload, release),
        (Err(e), _) | (_, Err(e)) => return internal_error(decision, body, input, rules, &e),
    };
    decision.payload = payload;
    decision.headers = content_type(Encoding::Json);
    if let (Outcome::Decode { .. }, Some(request_id)) = (&decision.outcome, &decision.request_id) {
        let (deadline, kv_expires) = (decision.deadline_ms, decision.kv_expires_ms);
        decision.headers.add_job(request_id, deadline, kv_expires);
    }
    if let (Some(release), Some(request_id), Some(payload)) =
        (&mut decision.release, &decision.request_id, release_payload)
    {
        release.payload = payload;
        release.headers = content_type(Encoding::Json);
        release
            .headers
            .push(NATS_MSG_ID, &release_msg_id(request_id));
    }
    decision
}

/// The `internal` error response for a result whose output could not be
/// written as JSON, to its reply subject: the decision's own subject for a
/// terminal or error response; for a decode job (sent to GEN) the
/// `reply_to` the result names, or the NATS reply subject `fast` took.
fn internal_error(
    decision: Decision,
    body: &[u8],
    input: Input<'_>,
    rules: &Rules,
    why: &NotJson,
) -> Decision {
    let output = match decision.outcome {
        Outcome::Decode { .. } => "decode job",
        Outcome::Terminal { .. } => "terminal response",
        Outcome::Error { .. } | Outcome::DeadLetter { .. } => "error response",
    };
    let message = unwritable(output, why);
    let subject = match decision.outcome {
        Outcome::Decode { .. } => match reply_to(body).or(input.nats_reply) {
            Some(subject) => subject.into(),
            // `fast` read a reply subject before it answered: not reached.
            None => return dead_letter(input, rules, DeadLetterCode::Malformed, message),
        },
        _ => decision.subject,
    };
    let code = ErrorCode::Internal;
    let reply = messages::error_response(decision.request_id.as_deref(), code.as_str(), &message);
    Decision {
        outcome: Outcome::Error { code },
        payload: wire::encode(&reply, Encoding::Json),
        headers: content_type(Encoding::Json),
        request_id: decision.request_id,
        subject,
        trailing_frames: decision.trailing_frames,
        detail: Some(message),
        deadline_ms: decision.deadline_ms,
        kv_expires_ms: None,
        release: None,
    }
}

/// The top-level `reply_to` string of a MessagePack body, if it has one.
fn reply_to(body: &[u8]) -> Option<&str> {
    let (_, mut spans) = scan::entries(body)?;
    while let (Some(key), Some(value)) = (spans.next(), spans.next()) {
        if scan::str_bytes(key) == Some(b"reply_to") {
            return std::str::from_utf8(scan::str_bytes(value)?).ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::decision::{Backend, NO_CANCELS, Release};
    use crate::headers::Headers;

    const RESULT: &[u8] = br#"{"request_id":"r-1","reply_to":"_INBOX.a","frames":[{}]}"#;
    /// `{nil: 1}`: a map key JSON cannot name.
    const NOT_JSON: &[u8] = b"\x81\xc0\x01";

    fn decision(outcome: Outcome, subject: &str, release: Option<&[u8]>) -> Decision {
        Decision {
            outcome,
            request_id: Some("r-1".into()),
            subject: subject.into(),
            headers: Headers::new(),
            payload: NOT_JSON.to_vec(),
            trailing_frames: 2,
            detail: None,
            deadline_ms: Some(7),
            kv_expires_ms: None,
            release: release.map(|payload| {
                Box::new(Release {
                    subject: "llm.kv.release".into(),
                    headers: Headers::new(),
                    payload: payload.to_vec(),
                })
            }),
        }
    }

    /// An output `fast` wrote that JSON cannot carry (an ID minted for it
    /// already) is answered `internal` on the result's reply subject, never
    /// written as a stand-in; a release notice that cannot be written makes
    /// the same answer. Each row: the decision, the subject answered.
    #[test]
    fn an_output_json_cannot_carry_is_answered_internal() {
        let rules = Rules::from_config(&Config::default().resolve().unwrap()).unwrap();
        let input = Input {
            payload: RESULT,
            encoding: Encoding::Json,
            subject: "llm.prefill.results",
            nats_reply: None,
            deadline_header: None,
            kv_expires_header: None,
            now_ms: 0,
            published_ms: 0,
            cancels: NO_CANCELS,
        };
        let body = json_to_msgpack(RESULT, plan).unwrap();
        let decode = Outcome::Decode {
            backend: Backend::Trtllm,
            minted: true,
        };
        let cancelled = Outcome::Error {
            code: ErrorCode::Cancelled,
        };
        let good = rmp_serde::to_vec_named(&serde_json::json!({"a": 1})).unwrap();
        let mut bad_release = decision(cancelled.clone(), "_INBOX.a", Some(NOT_JSON));
        bad_release.payload.clone_from(&good);
        let rows = [
            (decision(decode, "llm.gen.jobs", None), "_INBOX.a"),
            (decision(cancelled, "_INBOX.a", Some(&good)), "_INBOX.a"),
            (bad_release, "_INBOX.a"),
        ];
        for (i, (decision, subject)) in rows.into_iter().enumerate() {
            let answer = written_back(decision, &body, input, &rules);
            assert_eq!(
                answer.outcome,
                Outcome::Error {
                    code: ErrorCode::Internal
                },
                "row {i}"
            );
            assert_eq!(&*answer.subject, subject, "row {i}");
            assert_eq!(answer.release, None, "row {i}");
            assert_eq!(answer.trailing_frames, 2, "row {i}");
            let reply: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap();
            assert_eq!(reply["request_id"], "r-1", "row {i}");
            assert_eq!(reply["error"]["code"], "internal", "row {i}");
            let message = reply["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("bug in prefill-handoff"),
                "row {i}: {message}"
            );
        }
    }
}
