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
//! Why not the value tree: it costs about fifty times this per decision
//! (`docs/performance.md`), paid for every result of a JSON producer.

use super::header_values::content_type;
use super::known::{Key, Kind, Set, classify, keys, member, set};
use super::{Decision, IdSource, Input, Outcome, Rules, fast};
use crate::headers::names::NATS_MSG_ID;
use crate::headers::release_msg_id;
use crate::wire::Encoding;
use crate::wire::transcode::{Field, Plan, json_to_msgpack, msgpack_to_json};

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

/// The params the engine checks read: the `Key`s from `ctx_request_id` to
/// `remote_port`.
const ENGINE_KEYS: Set = keys(Key::CtxRequestId, Key::RemotePort);

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
        let kind = classify(key).0;
        if member(kind, read) {
            Field::Converted
        } else if level == TOP && kind == Key::Frames as Kind {
            Field::Objects(FRAME)
        } else if level == FRAME && kind == Key::DisaggregatedParams as Kind {
            Field::Object(PARAMS)
        } else if level == PARAMS && kind == Key::KvTransferParams as Kind {
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
    let mut decision = fast::decide(as_msgpack, rules, ids, fast::Origin::Json)?;
    // An output is about as large as its input (JSON is the larger form),
    // plus the job's own fields.
    let capacity = input.payload.len() + 512;
    decision.payload = msgpack_to_json(&decision.payload, capacity);
    decision.headers = content_type(Encoding::Json);
    if let (Outcome::Decode { .. }, Some(request_id)) = (&decision.outcome, &decision.request_id) {
        let (deadline, kv_expires) = (decision.deadline_ms, decision.kv_expires_ms);
        decision.headers.add_job(request_id, deadline, kv_expires);
    }
    if let (Some(release), Some(request_id)) = (&mut decision.release, &decision.request_id) {
        release.payload = msgpack_to_json(&release.payload, release.payload.len() * 2);
        release.headers = content_type(Encoding::Json);
        release
            .headers
            .push(NATS_MSG_ID, &release_msg_id(request_id));
    }
    Some(decision)
}
