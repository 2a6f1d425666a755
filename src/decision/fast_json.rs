//! The in-place decision for JSON results: the body is read token by token
//! into the canonical MessagePack that `fast` decides on, and the outputs
//! `fast` writes are written back as JSON (`wire::transcode`). No value
//! tree is built.
//!
//! Exact by construction: the MessagePack read here is what the value-tree
//! path's JSON decode would hold (the values `fast` copies without reading,
//! [`Reads`], may be carried as their canonical JSON text and are written
//! back as it is), `fast` decides on it as the value-tree path
//! does, and the JSON written back is what the value-tree path's encoder
//! writes; only the headers differ by encoding (`Content-Type`), and they are
//! set here as the value-tree path sets them. Everything `fast` declines, and
//! every body the JSON reader refuses (invalid, too deep, not an object),
//! returns `None` before any side effect; the caller takes the value-tree
//! path, which describes the problem.
//!
//! Why not the value tree: it costs several times this per decision
//! (`docs/performance.md`, the in-place and value-tree table), paid for
//! every result of a JSON producer.

use super::header_values::content_type;
use super::known::{Key, Set, set};
use super::{
    DeadLetterCode, Decision, ErrorCode, IdSource, Input, Outcome, Rules, dead_letter, fast,
    unwritable,
};
use crate::headers::names::NATS_MSG_ID;
use crate::headers::release_msg_id;
use crate::wire::transcode::{Field, Plan, json_to_msgpack, msgpack_to_json};
use crate::wire::{self, Encoding, NotJson, messages, scan};

/// What `fast` reads of a result and what it only copies: the values it
/// reads (the envelope, the first frame's reason and error, the params the
/// engine checks look at) are converted; every other value is copied into
/// the output as it is, so it may travel as its JSON text. A value read
/// here that `fast` looked into would make it decline (an ext value is no
/// string, number, map or nil to it), never answer differently.
pub(super) struct Reads;

const TOP: u8 = 0;
const FRAME: u8 = 1;
const PARAMS: u8 = 2;
/// The params' `kv_transfer_params` (Dynamo's nesting of vLLM's).
const NESTED: u8 = 3;

/// The params the engine checks read.
const ENGINE_KEYS: Set = set(&[
    "ctx_request_id",
    "request_type",
    "disagg_request_id",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "remote_engine_id",
    "remote_block_ids",
    "remote_port",
]);

/// The values `fast` reads at each level (`request` it takes as a whole:
/// a map, or an object's text).
const READ: [Set; 4] = [
    set(&["request_id", "reply_to", "deadline_ms", "kv_expires_ms"]),
    set(&["error", "finish_reason"]),
    ENGINE_KEYS,
    ENGINE_KEYS,
];

impl Plan for Reads {
    #[inline]
    fn field(&self, level: u8, key: &[u8]) -> Field {
        let read = READ[usize::from(level.min(NESTED))];
        let kind = Key::of(key);
        if kind.is_in(read) {
            Field::Converted
        } else if level == TOP && kind == Key::Frames {
            Field::Objects(FRAME)
        } else if level == FRAME && kind == Key::DisaggregatedParams {
            Field::Object(PARAMS)
        } else if level == PARAMS && kind == Key::KvTransferParams {
            Field::Object(NESTED)
        } else {
            Field::Copied
        }
    }
}

/// The decision for a JSON `input`, or `None` when the value-tree path must
/// decide.
pub(super) fn decide(input: Input<'_>, rules: &Rules, ids: &mut dyn IdSource) -> Option<Decision> {
    if input.encoding != Encoding::Json || input.payload.len() > rules.max_payload_bytes {
        return None;
    }
    let mut body = Vec::with_capacity(input.payload.len());
    json_to_msgpack(input.payload, &mut body, &Reads)?;
    let as_msgpack = Input {
        payload: &body,
        encoding: Encoding::MsgPack,
        ..input
    };
    let decision = fast::decide(as_msgpack, rules, ids, fast::Origin::Json)?;
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
    /// `{"a": <binary>}`: MessagePack JSON has no form for.
    const NOT_JSON: &[u8] = b"\x81\xa1a\xc4\x01\x00";

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
        let mut body = Vec::new();
        json_to_msgpack(RESULT, &mut body, &Reads).unwrap();
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
