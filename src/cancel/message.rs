//! The cancel message (contract 10): `{"request_id": "...", "reason": "..."}`
//! on `{ns}.handoff.cancel`, MessagePack, or JSON with `Content-Type:
//! application/json`. Unknown fields are ignored. A malformed cancel is
//! never answered (anyone may publish one, and nobody waits for an answer):
//! the worker counts it and logs why, with [`CancelError`].

use crate::decision::MAX_REQUEST_ID_BYTES;
use crate::decision::deadline::MAX_REASON_BYTES;
use crate::wire::{self, Encoding, map};
use rmpv::Value;

/// The largest cancel message read, in bytes: a request ID and a reason fit
/// many times over, and a larger body is not decoded at all.
pub const MAX_CANCEL_BYTES: usize = 4096;

/// One cancel, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancel {
    pub request_id: String,
    /// Cut to [`MAX_REASON_BYTES`].
    pub reason: Option<String>,
}

/// Why a cancel message is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CancelError {
    #[error("the cancel is {0} bytes; at most {MAX_CANCEL_BYTES} are read")]
    TooLarge(usize),
    #[error("the cancel cannot be decoded as {encoding}: {why}")]
    Undecodable { encoding: &'static str, why: String },
    #[error("the cancel is {0}; expected a map with request_id")]
    NotAMap(String),
    #[error("{0} in the cancel; expected a string of 1 to {MAX_REQUEST_ID_BYTES} bytes")]
    RequestId(String),
    #[error("the cancel's reason is {0}; expected a string or null")]
    Reason(String),
}

/// Reads a cancel message.
pub fn parse(payload: &[u8], encoding: Encoding) -> Result<Cancel, CancelError> {
    if payload.len() > MAX_CANCEL_BYTES {
        return Err(CancelError::TooLarge(payload.len()));
    }
    let top = match wire::decode(payload, encoding) {
        Ok(Value::Map(top)) => top,
        Ok(other) => return Err(CancelError::NotAMap(crate::decision::describe(&other))),
        Err(e) => {
            return Err(CancelError::Undecodable {
                encoding: encoding.as_str(),
                why: e.to_string(),
            });
        }
    };
    let count = |key: &str| top.iter().filter(|(k, _)| k.as_str() == Some(key)).count();
    if count("request_id") > 1 {
        return Err(CancelError::RequestId(
            "request_id appears more than once".into(),
        ));
    }
    let request_id = match map::get(&top, "request_id") {
        Some(Value::String(s)) => match s.as_str() {
            Some(id) if (1..=MAX_REQUEST_ID_BYTES).contains(&id.len()) => id.to_string(),
            Some(id) => {
                let why = format!("request_id is {} bytes long", id.len());
                return Err(CancelError::RequestId(why));
            }
            None => return Err(CancelError::RequestId("request_id is not UTF-8".into())),
        },
        Some(other) => {
            let why = format!("request_id is {}", crate::decision::describe(other));
            return Err(CancelError::RequestId(why));
        }
        None => return Err(CancelError::RequestId("request_id is missing".into())),
    };
    let reason = match map::get_non_nil(&top, "reason") {
        None => None,
        Some(Value::String(s)) => match s.as_str() {
            Some(text) => Some(cut(text, MAX_REASON_BYTES).to_string()),
            None => return Err(CancelError::Reason("a string that is not UTF-8".into())),
        },
        Some(other) => return Err(CancelError::Reason(crate::decision::describe(other))),
    };
    Ok(Cancel { request_id, reason })
}

/// A cancel message for `request_id`, as the `cancel` command publishes it.
pub fn encode(cancel: &Cancel, encoding: Encoding) -> Vec<u8> {
    let mut entries = vec![(
        Value::from("request_id"),
        Value::from(cancel.request_id.as_str()),
    )];
    if let Some(reason) = &cancel.reason {
        entries.push((Value::from("reason"), Value::from(reason.as_str())));
    }
    wire::encode(&Value::Map(entries), encoding)
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgpack(j: serde_json::Value) -> Vec<u8> {
        wire::encode(&rmpv::ext::to_value(j).unwrap(), Encoding::MsgPack)
    }

    fn ok(id: &str, reason: Option<&str>) -> Result<Cancel, ()> {
        Ok(Cancel {
            request_id: id.into(),
            reason: reason.map(str::to_string),
        })
    }

    #[test]
    fn cancels_are_read_in_both_encodings_and_malformed_ones_say_why() {
        let long_id = "x".repeat(257);
        let rows: [(serde_json::Value, Result<Cancel, ()>); 11] = [
            (json!({"request_id": "r1"}), ok("r1", None)),
            (
                json!({"request_id": "r1", "reason": "gone"}),
                ok("r1", Some("gone")),
            ),
            (json!({"request_id": "r1", "reason": null}), ok("r1", None)),
            (
                json!({"request_id": "r1", "by": "router", "n": 3}),
                ok("r1", None),
            ),
            (json!({"request_id": ""}), Err(())),
            (json!({"request_id": long_id}), Err(())),
            (json!({"request_id": 7}), Err(())),
            (json!({"reason": "gone"}), Err(())),
            (json!({"request_id": "r1", "reason": 5}), Err(())),
            (json!(["r1"]), Err(())),
            (json!("r1"), Err(())),
        ];
        for (body, want) in rows {
            for (bytes, encoding) in [
                (msgpack(body.clone()), Encoding::MsgPack),
                (serde_json::to_vec(&body).unwrap(), Encoding::Json),
            ] {
                let got = parse(&bytes, encoding);
                match &want {
                    Ok(cancel) => assert_eq!(got.as_ref(), Ok(cancel), "{body}"),
                    Err(()) => assert!(got.is_err(), "{body}: {got:?}"),
                }
            }
        }
    }

    #[test]
    fn what_cannot_be_a_cancel_is_refused_before_it_is_read() {
        assert!(matches!(
            parse(&[0xc1], Encoding::MsgPack),
            Err(CancelError::Undecodable { .. })
        ));
        assert!(matches!(
            parse(b"{\"request_id\": ", Encoding::Json),
            Err(CancelError::Undecodable { .. })
        ));
        let big = msgpack(json!({"request_id": "r1", "pad": "x".repeat(5000)}));
        assert_eq!(
            parse(&big, Encoding::MsgPack),
            Err(CancelError::TooLarge(big.len()))
        );
        // The same request ID twice is ambiguous.
        let twice = b"\x82\xaarequest_id\xa1a\xaarequest_id\xa1b";
        assert!(matches!(
            parse(twice, Encoding::MsgPack),
            Err(CancelError::RequestId(_))
        ));
        // A long reason is kept, cut.
        let long = msgpack(json!({"request_id": "r1", "reason": "é".repeat(300)}));
        let cancel = parse(&long, Encoding::MsgPack).unwrap();
        assert!(cancel.reason.unwrap().len() <= MAX_REASON_BYTES);
    }

    #[test]
    fn an_encoded_cancel_reads_back() {
        for encoding in [Encoding::MsgPack, Encoding::Json] {
            for reason in [None, Some("operator".to_string())] {
                let cancel = Cancel {
                    request_id: "chatcmpl-1".into(),
                    reason,
                };
                assert_eq!(parse(&encode(&cancel, encoding), encoding), Ok(cancel));
            }
        }
    }
}
