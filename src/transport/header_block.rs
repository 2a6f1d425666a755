//! Messages whose NATS header block could not be parsed.
//!
//! The header block comes verbatim from whoever published. The vendored
//! client (docs/vendor-async-nats.md) delivers a message whose block it could
//! not parse with one header only, [`HEADER_BLOCK_ERROR`], saying what was
//! wrong. The client sets it and never takes it from the wire (a block using
//! that name is itself unparsable), so a publisher forging it only gets its
//! own message dead-lettered.

use crate::decision::{self, Decision, IdSource, Input, Rules};
use async_nats::HeaderMap;
use async_nats::header::HEADER_BLOCK_ERROR;

/// The decision for one received message, in both modes: a `malformed` dead
/// letter when the client could not parse its header block, otherwise
/// [`decision::decide`].
pub fn decide(
    input: Input<'_>,
    headers: Option<&HeaderMap>,
    rules: &Rules,
    ids: &mut dyn IdSource,
) -> Decision {
    match headers.and_then(|h| h.get(HEADER_BLOCK_ERROR)) {
        Some(what) => decision::unreadable_headers(input, rules, what.as_str()),
        None => decision::decide(input, rules, ids),
    }
}
