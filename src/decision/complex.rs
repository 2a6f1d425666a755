//! Results too complex to read as value trees: answered from their top level.
//!
//! A value tree costs tens of bytes per value whatever the value's encoded
//! size, so a 1 MiB result whose first frame holds a million `nil` (one byte
//! each) is far larger as a tree (`docs/performance.md`, "Figures behind
//! choices in the code"). Results the in-place paths decide (any
//! canonical MessagePack or JSON decode or terminal result, whatever its size) never
//! get here; the rest are read as trees only up to [`MAX_TREE_VALUES`], and
//! beyond are refused as `malformed` — to the requester when the top level
//! names a usable reply subject, else as a dead letter.

use super::request;
use super::tree::Reply;
use super::{DeadLetterCode, Decision, ErrorCode, Input, Rules, dead_letter};
use crate::wire::peek;

/// The most values (scalars, keys, arrays and maps) a result may hold when
/// it is read as a value tree: a few MiB at most (the value tree's size per
/// value is in `docs/performance.md`); a prefill result's
/// first frame holds a few dozen, and a request carrying its prompt's token
/// IDs one per token — prompts past 32k tokens still pass in place in
/// canonical MessagePack, the encoding every MessagePack library writes.
pub const MAX_TREE_VALUES: usize = 32_768;

/// The answer for a result with more than [`MAX_TREE_VALUES`] values.
pub(super) fn refuse(input: Input<'_>, rules: &Rules) -> Decision {
    let why = format!(
        "the message holds more than {MAX_TREE_VALUES} values (arrays, maps, keys and scalars); \
         a result of that complexity is accepted only with a decode or terminal outcome, as canonical MessagePack or as JSON"
    );
    let top = peek::top_level(input.payload, input.encoding);
    if !top.whole {
        return dead_letter(input, rules, DeadLetterCode::Malformed, why);
    }
    let subject = match request::reply_subject(&top.entries, input, rules) {
        Ok(subject) => subject,
        Err((code, reason)) => return dead_letter(input, rules, code, format!("{reason}; {why}")),
    };
    let request_id = top.request_id();
    let reply = Reply {
        encoding: input.encoding,
        subject,
        request_id,
        size_hint: 0,
        deadline_ms: None,
        kv_expires_ms: None,
    };
    reply.error(ErrorCode::Malformed, why, 0)
}
