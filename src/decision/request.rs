//! Reading a prefill result (contract 4.1): first where answers go, then the
//! shape every result must have.
//!
//! The order matters. Until a usable, allowed reply subject is known, the
//! only possible answer is a dead letter; after that, every problem is an
//! error response the client can see.

use super::{DeadLetterCode, Input, Refusal, Rules, describe};
use crate::wire::map;
use rmpv::Value;

pub use crate::wire::messages::MAX_REQUEST_ID_BYTES;

/// The parts of a well-formed prefill result.
pub(super) struct Request {
    pub request_id: String,
    pub frames: Vec<Value>,
    /// The `request` map, when present and not null.
    pub request: Option<Value>,
    /// Every other top-level entry, in order: passed on to decode.
    pub rest: Vec<(Value, Value)>,
}

/// Why a result with a known reply subject is malformed: the `request_id`
/// when it was usable (so the client can correlate), and a sentence.
pub(super) struct Malformed {
    pub request_id: Option<String>,
    pub why: String,
}

/// The reply subject of a result: the body's `reply_to`, or in core mode the
/// NATS message's own reply subject when the body has none. A present `null`
/// counts as absent.
pub(super) fn reply_subject(
    top: &[(Value, Value)],
    input: Input<'_>,
    rules: &Rules,
) -> Result<String, (DeadLetterCode, String)> {
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
            Some(s) => s,
            None => {
                return Err((
                    DeadLetterCode::Malformed,
                    "reply_to is not valid UTF-8; expected a NATS subject string".into(),
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
            Some(s) => s,
            None => {
                let why = if rules.use_nats_reply {
                    "the message has no reply_to field and no NATS reply subject; expected one of them"
                } else {
                    "the message has no reply_to field; in JetStream mode the reply subject must be in the body"
                };
                return Err((DeadLetterCode::MissingReplyTo, why.into()));
            }
        },
    };
    rules
        .reply_policy
        .check(subject)
        .map_err(|why: Refusal| (DeadLetterCode::ReplyToNotAllowed, why.to_string()))?;
    Ok(subject.to_string())
}

/// Checks the shape every result must have, once its reply subject is known,
/// and takes it apart.
pub(super) fn check(mut top: Vec<(Value, Value)>) -> Result<Request, Malformed> {
    let request_id = request_id(&top);
    if let Some(key) = map::duplicate_key(&top) {
        // Which of two request IDs is meant cannot be known: answer with none.
        let known = request_id.as_ref().ok().filter(|_| key != "request_id");
        return Err(Malformed {
            request_id: known.cloned(),
            why: format!(
                "the message holds the key {key:?} more than once; each key must appear once"
            ),
        });
    }
    let fail = |why: String| Malformed {
        request_id: request_id.as_ref().ok().cloned(),
        why,
    };
    let request_id = request_id.clone().map_err(fail)?;
    match map::get(&top, "frames") {
        Some(Value::Array(frames)) => {
            if let Some(i) = frames.iter().position(|f| !f.is_map()) {
                return Err(fail(format!(
                    "frame {i} is {}; every frame must be a map",
                    describe(&frames[i])
                )));
            }
        }
        Some(other) => {
            return Err(fail(format!(
                "frames is {}; expected an array of frame maps",
                describe(other)
            )));
        }
        None => {
            return Err(fail(
                "frames is missing; expected an array of frame maps".into(),
            ));
        }
    }
    if let Some(request) = map::get_non_nil(&top, "request")
        && !request.is_map()
    {
        return Err(fail(format!(
            "request is {}; expected a map",
            describe(request)
        )));
    }
    let frames = match map::take(&mut top, "frames") {
        Some(Value::Array(frames)) => frames,
        _ => Vec::new(),
    };
    let request = map::take(&mut top, "request").filter(|v| !v.is_nil());
    map::remove(&mut top, "request_id");
    map::remove(&mut top, "reply_to");
    Ok(Request {
        request_id,
        frames,
        request,
        rest: top,
    })
}

fn request_id(top: &[(Value, Value)]) -> Result<String, String> {
    match map::get(top, "request_id") {
        Some(Value::String(s)) => match s.as_str() {
            Some(id) if (1..=MAX_REQUEST_ID_BYTES).contains(&id.len()) => Ok(id.to_string()),
            Some(id) => Err(format!(
                "request_id is {} bytes long; expected 1 to {MAX_REQUEST_ID_BYTES} bytes",
                id.len()
            )),
            None => Err("request_id is not valid UTF-8; expected a UTF-8 string".into()),
        },
        Some(other) => Err(format!(
            "request_id is {}; expected a string of 1 to {MAX_REQUEST_ID_BYTES} bytes",
            describe(other)
        )),
        None => Err(format!(
            "request_id is missing; expected a string of 1 to {MAX_REQUEST_ID_BYTES} bytes"
        )),
    }
}
