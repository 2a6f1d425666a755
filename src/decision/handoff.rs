//! Validation of `disaggregated_params` per engine shape (contract 4.2 rule 4).
//!
//! Each engine's handoff must carry what its decode side needs to find the KV
//! cache; a handoff that cannot work is answered with an error now rather than
//! failing inside a decode worker later.

use super::{ErrorCode, IdSource, Minted};
use crate::decision::Backend;
use crate::wire::map;
use rmpv::Value;

pub(super) const TRTLLM_KEYS: [&str; 5] = [
    "ctx_request_id",
    "request_type",
    "disagg_request_id",
    "opaque_state",
    "first_gen_tokens",
];
pub(super) const VLLM_KEYS: [&str; 3] =
    ["do_remote_prefill", "remote_engine_id", "remote_block_ids"];

/// A validated handoff, ready to be sent to decode.
#[derive(Debug)]
pub struct Handoff {
    pub backend: Backend,
    pub params: Vec<(Value, Value)>,
    /// TensorRT-LLM only: the kept or minted ID.
    pub disagg_request_id: Option<u64>,
    /// When `disagg_request_id` was minted by this worker: by whom.
    pub minted: Option<Minted>,
}

pub type Refused = (ErrorCode, String);

/// Which shape a params map has. TensorRT-LLM keys win over SGLang's, which
/// win over vLLM's: the first engine recognised decides the validation.
pub fn backend_of(params: &[(Value, Value)]) -> Backend {
    let has_any = |keys: &[&str]| keys.iter().any(|k| map::has(params, k));
    if has_any(&TRTLLM_KEYS) {
        Backend::Trtllm
    } else if params
        .iter()
        .any(|(k, _)| k.as_str().is_some_and(|k| k.starts_with("bootstrap_")))
    {
        Backend::Sglang
    } else if has_any(&VLLM_KEYS) {
        Backend::Vllm
    } else {
        Backend::Opaque
    }
}

/// Checks a handoff: which engine's shape it has, and that decode can work
/// with it. Nothing is minted yet: a handoff refused after this check
/// (cancelled, past its deadline) spends no ID.
pub fn check(params: &[(Value, Value)]) -> Result<Backend, Refused> {
    if let Some(key) = map::duplicate_key(params) {
        return Err((
            ErrorCode::Malformed,
            format!(
                "disaggregated_params holds the key {key:?} more than once; each key must appear once"
            ),
        ));
    }
    let backend = backend_of(params);
    match backend {
        Backend::Trtllm => trtllm(params)?,
        Backend::Sglang => sglang(params)?,
        Backend::Vllm => vllm(params)?,
        Backend::Opaque => {}
    }
    Ok(backend)
}

/// Completes a handoff that passed [`check`] as `backend`: for TensorRT-LLM,
/// `request_type` set to `"generation_only"` and `disagg_request_id` kept or
/// minted now.
pub fn complete(
    mut params: Vec<(Value, Value)>,
    backend: Backend,
    ids: &mut dyn IdSource,
) -> Result<Handoff, Refused> {
    if backend != Backend::Trtllm {
        return Ok(Handoff {
            backend,
            params,
            disagg_request_id: None,
            minted: None,
        });
    }
    let kept = map::get_non_nil(&params, "disagg_request_id").and_then(Value::as_u64);
    let (id, minted) = match kept {
        Some(id) => (id, None),
        None => match ids.mint_for_job() {
            Ok(minted) => (minted.id, Some(minted)),
            Err(why) => {
                return Err((
                    ErrorCode::IdentityUnavailable,
                    format!(
                        "this worker cannot mint a disagg_request_id right now ({why}); retry, another worker may hold a valid slot"
                    ),
                ));
            }
        },
    };
    map::set(&mut params, "request_type", Value::from("generation_only"));
    map::set(&mut params, "disagg_request_id", Value::from(id));
    Ok(Handoff {
        backend,
        params,
        disagg_request_id: Some(id),
        minted,
    })
}

/// An integer in `[lo, hi]`, from any MessagePack integer encoding. Floats,
/// strings and booleans are not integers.
pub fn int_in(value: &Value, lo: u64, hi: u64) -> Option<u64> {
    // Negative integers have no u64 form and floats are not integers, so both
    // fall out here.
    value.as_u64().filter(|v| (lo..=hi).contains(v))
}

const MAX_I63: u64 = (1 << 63) - 1;

/// The message of a `missing_ctx_request_id` error response.
pub(super) const MISSING_CTX_REQUEST_ID: &str = "ctx_request_id is missing or null; a decode handoff needs the integer request ID that TensorRT-LLM's context phase returned";

/// The TensorRT-LLM checks; the ID is kept or minted by [`complete`].
fn trtllm(params: &[(Value, Value)]) -> Result<(), Refused> {
    match map::get_non_nil(params, "ctx_request_id") {
        None => {
            return Err((
                ErrorCode::MissingCtxRequestId,
                MISSING_CTX_REQUEST_ID.into(),
            ));
        }
        Some(v) if int_in(v, 0, MAX_I63).is_none() => {
            return Err((
                ErrorCode::InvalidCtxRequestId,
                format!(
                    "ctx_request_id is {}; expected an integer in [0, 2^63)",
                    describe(v)
                ),
            ));
        }
        Some(_) => {}
    }
    if let Some(v) = map::get_non_nil(params, "request_type")
        && v.as_str() != Some("context_only")
    {
        return Err((
            ErrorCode::InvalidRequestType,
            format!(
                "request_type is {}; a prefill result must carry \"context_only\"",
                describe(v)
            ),
        ));
    }
    if let Some(v) = map::get_non_nil(params, "disagg_request_id")
        && int_in(v, 1, MAX_I63 - 1).is_none()
    {
        return Err((
            ErrorCode::InvalidDisaggRequestId,
            format!(
                "disagg_request_id is {}; expected null or an integer in [1, 2^63 - 1)",
                describe(v)
            ),
        ));
    }
    Ok(())
}

fn sglang(params: &[(Value, Value)]) -> Result<(), Refused> {
    let refuse = |what: String| {
        Err((
            ErrorCode::InvalidBootstrap,
            format!(
                "{what}; an SGLang handoff needs bootstrap_host (non-empty string), bootstrap_port (1..=65535) and bootstrap_room (integer in [0, 2^63))"
            ),
        ))
    };
    match map::get(params, "bootstrap_host") {
        Some(Value::String(s)) if s.as_str().is_some_and(|s| !s.is_empty()) => {}
        other => return refuse(format!("bootstrap_host is {}", describe_opt(other))),
    }
    let port = map::get(params, "bootstrap_port");
    if port.and_then(|v| int_in(v, 1, 65535)).is_none() {
        return refuse(format!("bootstrap_port is {}", describe_opt(port)));
    }
    let room = map::get(params, "bootstrap_room");
    if room.and_then(|v| int_in(v, 0, MAX_I63)).is_none() {
        return refuse(format!("bootstrap_room is {}", describe_opt(room)));
    }
    Ok(())
}

fn vllm(params: &[(Value, Value)]) -> Result<(), Refused> {
    let refuse = |what: String| {
        Err((
            ErrorCode::InvalidKvTransferParams,
            format!(
                "{what}; a vLLM handoff needs remote_engine_id (non-empty string), remote_block_ids (array of non-negative integers) and, when present, remote_port in 1..=65535"
            ),
        ))
    };
    match map::get(params, "remote_engine_id") {
        Some(Value::String(s)) if s.as_str().is_some_and(|s| !s.is_empty()) => {}
        other => return refuse(format!("remote_engine_id is {}", describe_opt(other))),
    }
    match map::get(params, "remote_block_ids") {
        Some(Value::Array(ids)) if ids.iter().all(|v| int_in(v, 0, u64::MAX).is_some()) => {}
        Some(Value::Array(_)) => {
            return refuse(
                "remote_block_ids holds an entry that is not a non-negative integer".into(),
            );
        }
        other => return refuse(format!("remote_block_ids is {}", describe_opt(other))),
    }
    if let Some(port) = map::get_non_nil(params, "remote_port")
        && int_in(port, 1, 65535).is_none()
    {
        return refuse(format!("remote_port is {}", describe(port)));
    }
    Ok(())
}

/// A short description of a value for error messages: its type, and the value
/// itself when it is short.
pub fn describe(value: &Value) -> String {
    match value {
        Value::Nil => "null".into(),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Integer(i) => format!("the integer {i}"),
        Value::F32(f) => format!("the float {f}"),
        Value::F64(f) => format!("the float {f}"),
        Value::String(s) => match s.as_str() {
            Some(s) if s.len() <= 64 => format!("the string {s:?}"),
            Some(s) => format!("a string of {} bytes", s.len()),
            None => "a string that is not valid UTF-8".into(),
        },
        Value::Binary(b) => format!("binary data of {} bytes", b.len()),
        Value::Array(a) => format!("an array of {} items", a.len()),
        Value::Map(m) => format!("a map of {} entries", m.len()),
        Value::Ext(t, _) => format!("a MessagePack ext value of type {t}"),
    }
}

fn describe_opt(value: Option<&Value>) -> String {
    value.map_or_else(|| "missing".into(), describe)
}
