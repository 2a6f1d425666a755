//! The ID mint service (contract 4.3): dispatchers that must name a request
//! before prefill (as TensorRT-LLM's orchestrator does) ask the fleet for IDs
//! over NATS request/reply and get IDs minted from an exclusive machine-ID
//! slot, so they never collide with any other worker's.
//!
//! [`answer`] is the service without the network: request body in, reply body
//! out. `budget.rs` is the service's own token bucket of IDs, so clients
//! cannot starve the decode jobs minting from the same slot. `serve.rs`
//! subscribes in a queue group and publishes the answers.

mod budget;
mod serve;

pub use budget::{Budget, OverBudget};
pub use serve::{IdService, IdServiceError, serve};

use crate::decision::{ErrorCode, describe};
use crate::identity::Identity;
use crate::metrics::IdRequestResult;
use crate::wire::{self, Encoding, map, messages};
use rmpv::Value;
use std::time::Instant;

/// The most IDs one request may ask for.
pub const MAX_COUNT: u64 = 1024;

/// The largest request body read. A valid one is a few bytes.
pub const MAX_REQUEST_BYTES: usize = 4096;

/// The reply to one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub result: IdRequestResult,
    /// How many IDs the payload carries.
    pub minted: usize,
    /// Encoded in the request's encoding.
    pub payload: Vec<u8>,
    /// A sentence for logs when the request failed.
    pub detail: Option<String>,
}

const EXPECTED: &str =
    "an ID request is an empty body or a map {\"count\": N} with N an integer in 1..=1024";

/// Why a request body is refused (`malformed`). Every message ends with what
/// a request should look like.
#[derive(Debug, thiserror::Error)]
pub enum BadRequest {
    #[error("the request is {0} bytes; {EXPECTED}")]
    TooLarge(usize),
    #[error("{0}; {EXPECTED}")]
    Undecodable(#[from] wire::WireError),
    /// What the body is instead (`describe`'s words).
    #[error("the body is {0}; {EXPECTED}")]
    NotAMap(String),
    #[error("the request holds count {0} times; {EXPECTED}")]
    RepeatedCount(usize),
    /// What `count` is instead.
    #[error("count is {0}; {EXPECTED}")]
    BadCount(String),
}

/// How many IDs a request body asks for: 1 for an empty body, a map without
/// `count`, or `count: null`. Other keys are ignored, so requests can grow.
pub fn requested_count(body: &[u8], encoding: Encoding) -> Result<usize, BadRequest> {
    if body.is_empty() {
        return Ok(1);
    }
    if body.len() > MAX_REQUEST_BYTES {
        return Err(BadRequest::TooLarge(body.len()));
    }
    let value = wire::decode(body, encoding)?;
    let Value::Map(entries) = value else {
        return Err(BadRequest::NotAMap(describe(&value)));
    };
    let counts = entries
        .iter()
        .filter(|(k, _)| k.as_str() == Some("count"))
        .count();
    if counts > 1 {
        return Err(BadRequest::RepeatedCount(counts));
    }
    let Some(count) = map::get_non_nil(&entries, "count") else {
        return Ok(1);
    };
    match count.as_u64() {
        // `as_u64` is None for floats, so 2.0 is refused like the contract says.
        Some(n) if (1..=MAX_COUNT).contains(&n) => Ok(n as usize),
        _ => Err(BadRequest::BadCount(describe(count))),
    }
}

/// Answers one request body received at `now` with IDs from `identity`,
/// taken from `budget`, or with an error response (`malformed`,
/// `rate_limited`, `identity_unavailable`; `request_id` null).
pub fn answer(
    body: &[u8],
    encoding: Encoding,
    identity: &Identity,
    budget: &mut Budget,
    now: Instant,
) -> Answer {
    let failed = |result, code: ErrorCode, message: String| Answer {
        result,
        minted: 0,
        payload: wire::encode(
            &messages::error_response(None, code.as_str(), &message),
            encoding,
        ),
        detail: Some(message),
    };
    let count = match requested_count(body, encoding) {
        Ok(count) => count,
        Err(why) => {
            return failed(
                IdRequestResult::Malformed,
                ErrorCode::Malformed,
                why.to_string(),
            );
        }
    };
    if let Err(over) = budget.take(count as u64, now) {
        return failed(
            IdRequestResult::RateLimited,
            ErrorCode::RateLimited,
            over.to_string(),
        );
    }
    match identity.mint_many(count) {
        Ok((ids, machine_id)) => Answer {
            result: IdRequestResult::Ok,
            minted: ids.len(),
            payload: wire::encode(
                &messages::mint_response(&ids, machine_id, identity.layout()),
                encoding,
            ),
            detail: None,
        },
        Err(unavailable) => failed(
            IdRequestResult::IdentityUnavailable,
            ErrorCode::IdentityUnavailable,
            unavailable.0,
        ),
    }
}

/// The answer to a request whose NATS header block the client could not
/// parse (`what` says why, as [`crate::headers::block_error`]
/// returns it): `malformed`, whatever its body, as the pipeline dead-letters
/// such a result. The headers it was sent with are unknown, its content type
/// among them, so the answer is MessagePack (contract 3's default), and no
/// IDs are taken from the budget or minted.
pub fn unreadable_headers(what: &str) -> Answer {
    let message = format!("the request's NATS header block could not be parsed: {what}");
    Answer {
        result: IdRequestResult::Malformed,
        minted: 0,
        payload: wire::encode(
            &messages::error_response(None, ErrorCode::Malformed.as_str(), &message),
            Encoding::MsgPack,
        ),
        detail: Some(message),
    }
}

#[cfg(test)]
mod tests;
