//! Validation of `disaggregated_params` per engine shape (contract 4.2 rule 4).
//!
//! Each engine's handoff must carry what its decode side needs to find the KV
//! cache; a handoff that cannot work is answered with an error now rather than
//! failing inside a decode worker later.

use super::known::{Key, Set, TRTLLM, VLLM};
use super::{ErrorCode, IdSource, Input, Minted, Rules, deadline};
use crate::config::MissingDisaggRequestId;
use crate::decision::Backend;
use crate::wire::{describe, map};
use rmpv::Value;

/// Dynamo's vLLM handlers nest vLLM's `kv_transfer_params` under this key of
/// `disaggregated_params`.
pub(super) const NESTED_VLLM: &str = "kv_transfer_params";

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

/// The `disagg_request_id` a TensorRT-LLM decode job goes on with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisaggId {
    /// The context phase's, kept.
    Kept(u64),
    /// Minted here (`trtllm.missing_disagg_request_id = "mint"`).
    Minted(Minted),
    /// None, passed on as null (`"pass"`).
    Passed,
}

impl DisaggId {
    pub fn id(self) -> Option<u64> {
        match self {
            DisaggId::Kept(id) => Some(id),
            DisaggId::Minted(minted) => Some(minted.id),
            DisaggId::Passed => None,
        }
    }
}

/// The message of a `missing_disagg_request_id` error response.
pub(super) const MISSING_DISAGG_REQUEST_ID: &str = "disagg_request_id is missing or null; TensorRT-LLM keys the KV transfer by the ID its context phase ran with, so mint it from the worker's ID service (subjects.ids, by default llm.handoff.ids) before the context phase and send it in the context request's disaggregated_params (or see trtllm.missing_disagg_request_id)";

/// The `disagg_request_id` for a TensorRT-LLM handoff that passed [`check`]:
/// `kept` (the valid ID it carries) or, without one, what `policy` says.
/// Asked after the refusal rules, so that a refused result spends no ID.
pub fn disagg_id(
    kept: Option<u64>,
    policy: MissingDisaggRequestId,
    ids: &mut dyn IdSource,
) -> Result<DisaggId, Refused> {
    if let Some(id) = kept {
        return Ok(DisaggId::Kept(id));
    }
    match policy {
        MissingDisaggRequestId::Refuse => Err((
            ErrorCode::MissingDisaggRequestId,
            MISSING_DISAGG_REQUEST_ID.into(),
        )),
        MissingDisaggRequestId::Pass => Ok(DisaggId::Passed),
        MissingDisaggRequestId::Mint => match ids.mint_for_job() {
            Ok(minted) => Ok(DisaggId::Minted(minted)),
            Err(why) => Err((
                ErrorCode::IdentityUnavailable,
                format!(
                    "this worker cannot mint a disagg_request_id right now ({why}); retry, another worker may hold a valid slot"
                ),
            )),
        },
    }
}

/// A handoff whose params passed validation, before the rules that may
/// still refuse it.
pub(super) struct Pending<'a> {
    pub request_id: &'a str,
    pub backend: Backend,
    /// The effective deadline.
    pub deadline: Option<u64>,
    /// When the KV is freed, as the result says (field or header).
    pub kv_expires: Option<u64>,
    /// TensorRT-LLM: the valid `disagg_request_id` the params carry.
    pub kept: Option<u64>,
}

/// Rules 4's end and 5's start, stated once for both decision paths: when
/// the KV is freed (the result's word, else its engine's hold), then the
/// refusals in their order (`deadline::refusal`: cancel, deadline, KV), then
/// TensorRT-LLM's ID policy ([`disagg_id`]), last because it may mint.
/// Returns the KV's expiry and the job's ID (`None` for other engines) or
/// why the handoff is refused; every refusal frees the KV.
pub(super) fn admit(
    pending: Pending<'_>,
    input: Input<'_>,
    rules: &Rules,
    ids: &mut dyn IdSource,
) -> (Option<u64>, Result<Option<DisaggId>, Refused>) {
    let kv_expires = pending
        .kv_expires
        .or_else(|| rules.kv_expiry(pending.backend, input.published_ms));
    let timing = deadline::Timing {
        request_id: pending.request_id,
        deadline: pending.deadline,
        kv_expires,
        now_ms: input.now_ms,
        skew_ms: rules.deadline_skew_ms,
    };
    let disagg = match deadline::refusal(timing, input.cancels) {
        Some(refusal) => Err(refusal),
        None if pending.backend == Backend::Trtllm => {
            disagg_id(pending.kept, rules.missing_disagg_request_id, ids).map(Some)
        }
        None => Ok(None),
    };
    (kv_expires, disagg)
}

pub type Refused = (ErrorCode, String);

/// A params map as the checks below read it, from either decision path:
/// the value tree's entries ([`Tree`]) or the in-place path's spans
/// (`fast`). The engines' rules are written once, against this.
pub(super) trait Params<'a>: Sized {
    /// One value of the map.
    type Value: Copy;
    /// The value under `key`.
    fn get(&self, key: Key) -> Option<Self::Value>;
    /// Whether a key of `set` is there.
    fn has_any(&self, set: Set) -> bool;
    /// Whether a string key starts with `prefix`.
    fn has_prefix(&self, prefix: &str) -> bool;
    /// `value`, found under `kv_transfer_params`, as a params map.
    fn nested(&self, value: Self::Value) -> Option<Self>;
    fn is_nil(value: Self::Value) -> bool;
    /// A non-negative integer, in any encoding.
    fn uint(value: Self::Value) -> Option<u64>;
    fn str(value: Self::Value) -> Option<&'a str>;
    /// The items of an array.
    fn items(value: Self::Value) -> Option<impl Iterator<Item = Self::Value>>;
    /// [`describe`].
    fn describe(value: Self::Value) -> String;

    /// Like [`Params::get`], with a present `nil` counted as absent.
    fn get_non_nil(&self, key: Key) -> Option<Self::Value> {
        self.get(key).filter(|v| !Self::is_nil(*v))
    }
}

/// A value tree's params map.
pub(super) struct Tree<'a>(pub &'a [(Value, Value)]);

impl<'a> Params<'a> for Tree<'a> {
    type Value = &'a Value;

    fn get(&self, key: Key) -> Option<&'a Value> {
        self.0
            .iter()
            .find(|(k, _)| k.as_str().is_some_and(|k| Key::named(k.as_bytes()) == key))
            .map(|(_, v)| v)
    }

    fn has_any(&self, set: Set) -> bool {
        self.0.iter().any(|(k, _)| {
            k.as_str()
                .is_some_and(|k| Key::named(k.as_bytes()).is_in(set))
        })
    }

    fn has_prefix(&self, prefix: &str) -> bool {
        self.0
            .iter()
            .any(|(k, _)| k.as_str().is_some_and(|k| k.starts_with(prefix)))
    }

    fn nested(&self, value: &'a Value) -> Option<Tree<'a>> {
        value.as_map().map(|m| Tree(m))
    }

    fn is_nil(value: &'a Value) -> bool {
        value.is_nil()
    }

    fn uint(value: &'a Value) -> Option<u64> {
        value.as_u64()
    }

    fn str(value: &'a Value) -> Option<&'a str> {
        value.as_str()
    }

    fn items(value: &'a Value) -> Option<impl Iterator<Item = &'a Value>> {
        value.as_array().map(|items| items.iter())
    }

    fn describe(value: &'a Value) -> String {
        describe(value)
    }
}

/// Which shape a params map has. TensorRT-LLM keys win over SGLang's, which
/// win over vLLM's (its own keys, or Dynamo's nesting of them): the first
/// engine recognised decides the validation.
pub fn backend_of(params: &[(Value, Value)]) -> Backend {
    shape(&Tree(params))
}

fn shape<'a, P: Params<'a>>(params: &P) -> Backend {
    if params.has_any(TRTLLM) {
        Backend::Trtllm
    } else if params.has_prefix("bootstrap_") {
        Backend::Sglang
    } else if params.has_any(VLLM) || params.get(Key::KvTransferParams).is_some() {
        Backend::Vllm
    } else {
        Backend::Opaque
    }
}

/// Checks a value tree's handoff: no key twice, then [`check_params`].
pub fn check(params: &[(Value, Value)]) -> Result<(Backend, Option<u64>), Refused> {
    if let Some(key) = map::duplicate_key(params) {
        return Err((
            ErrorCode::Malformed,
            format!(
                "disaggregated_params holds the key {key:?} more than once; each key must appear once"
            ),
        ));
    }
    check_params(&Tree(params))
}

/// Checks a handoff: which engine's shape it has, and that decode can work
/// with it; for TensorRT-LLM also the valid `disagg_request_id` it carries,
/// if any. Nothing is minted yet: a handoff refused after this check
/// (cancelled, past its deadline) spends no ID.
pub(super) fn check_params<'a, P: Params<'a>>(
    params: &P,
) -> Result<(Backend, Option<u64>), Refused> {
    let backend = shape(params);
    let kept = match backend {
        Backend::Trtllm => trtllm(params)?,
        Backend::Sglang => sglang(params).map(|()| None)?,
        Backend::Vllm => vllm(params).map(|()| None)?,
        Backend::Opaque => None,
    };
    Ok((backend, kept))
}

/// Completes a handoff that passed [`check`] as `backend`: for
/// TensorRT-LLM (`disagg` is then `Some`), `request_type` set to
/// `"generation_only"` and `disagg_request_id` to the kept or minted ID (a
/// passed one is left as it came).
pub fn complete(
    mut params: Vec<(Value, Value)>,
    backend: Backend,
    disagg: Option<DisaggId>,
) -> Handoff {
    let Some(disagg) = disagg.filter(|_| backend == Backend::Trtllm) else {
        return Handoff {
            backend,
            params,
            disagg_request_id: None,
            minted: None,
        };
    };
    map::set(&mut params, "request_type", Value::from("generation_only"));
    if let Some(id) = disagg.id() {
        map::set(&mut params, "disagg_request_id", Value::from(id));
    }
    Handoff {
        backend,
        params,
        disagg_request_id: disagg.id(),
        minted: match disagg {
            DisaggId::Minted(minted) => Some(minted),
            _ => None,
        },
    }
}

const MAX_I63: u64 = (1 << 63) - 1;

/// The message of a `missing_ctx_request_id` error response.
pub(super) const MISSING_CTX_REQUEST_ID: &str = "ctx_request_id is missing or null; a decode handoff needs the integer request ID that TensorRT-LLM's context phase returned";

/// An integer in `lo..=hi`, from any MessagePack integer encoding.
fn int_in<'a, P: Params<'a>>(value: P::Value, lo: u64, hi: u64) -> Option<u64> {
    // Negative integers have no u64 form and floats are not integers, so both
    // fall out here.
    P::uint(value).filter(|v| (lo..=hi).contains(v))
}

/// The TensorRT-LLM checks; returns the valid `disagg_request_id` the
/// params carry (the ID is kept or minted by [`complete`]).
fn trtllm<'a, P: Params<'a>>(params: &P) -> Result<Option<u64>, Refused> {
    match params.get_non_nil(Key::CtxRequestId) {
        None => {
            return Err((
                ErrorCode::MissingCtxRequestId,
                MISSING_CTX_REQUEST_ID.into(),
            ));
        }
        Some(v) if int_in::<P>(v, 0, MAX_I63).is_none() => {
            return Err((
                ErrorCode::InvalidCtxRequestId,
                format!(
                    "ctx_request_id is {}; expected an integer in [0, 2^63)",
                    P::describe(v)
                ),
            ));
        }
        Some(_) => {}
    }
    if let Some(v) = params.get_non_nil(Key::RequestType)
        && !P::str(v).is_some_and(is_context_only)
    {
        return Err((
            ErrorCode::InvalidRequestType,
            format!(
                "request_type is {}; a prefill result must carry \"context_only\" (in any case)",
                P::describe(v)
            ),
        ));
    }
    let Some(v) = params.get_non_nil(Key::DisaggRequestId) else {
        return Ok(None);
    };
    match int_in::<P>(v, 1, MAX_I63 - 1) {
        Some(id) => Ok(Some(id)),
        None => Err((
            ErrorCode::InvalidDisaggRequestId,
            format!(
                "disagg_request_id is {}; expected null or an integer in [1, 2^63 - 1)",
                P::describe(v)
            ),
        )),
    }
}

/// TensorRT-LLM's request type of a context phase: its enum's name is
/// `CONTEXT_ONLY`, its serve API's value `context_only`.
pub(super) fn is_context_only(request_type: &str) -> bool {
    request_type.eq_ignore_ascii_case("context_only")
}

fn sglang<'a, P: Params<'a>>(params: &P) -> Result<(), Refused> {
    let refuse = |what: String| {
        Err((
            ErrorCode::InvalidBootstrap,
            format!(
                "{what}; an SGLang handoff needs bootstrap_host (non-empty string), bootstrap_port (1..=65535, or null for the engine's default port) and bootstrap_room (integer in [0, 2^63))"
            ),
        ))
    };
    let host = params.get(Key::BootstrapHost);
    if host.and_then(P::str).is_none_or(str::is_empty) {
        return refuse(format!("bootstrap_host is {}", describe_opt::<P>(host)));
    }
    if let Some(port) = params.get_non_nil(Key::BootstrapPort)
        && int_in::<P>(port, 1, 65535).is_none()
    {
        return refuse(format!("bootstrap_port is {}", P::describe(port)));
    }
    let room = params.get(Key::BootstrapRoom);
    if room.and_then(|v| int_in::<P>(v, 0, MAX_I63)).is_none() {
        return refuse(format!("bootstrap_room is {}", describe_opt::<P>(room)));
    }
    Ok(())
}

fn vllm<'a, P: Params<'a>>(params: &P) -> Result<(), Refused> {
    let refuse = |what: String| {
        Err((
            ErrorCode::InvalidKvTransferParams,
            format!(
                "{what}; a vLLM handoff needs remote_engine_id (non-empty string), remote_block_ids (an array of non-negative integers, or one such array per KV-cache group) and, when present, remote_port in 1..=65535"
            ),
        ))
    };
    if !params.has_any(VLLM)
        && let Some(nested) = params.get(Key::KvTransferParams)
    {
        return match params.nested(nested) {
            Some(inner) => {
                vllm(&inner).map_err(|(code, why)| (code, format!("in {NESTED_VLLM}: {why}")))
            }
            None => refuse(format!("{NESTED_VLLM} is {}", P::describe(nested))),
        };
    }
    let engine = params.get(Key::RemoteEngineId);
    if engine.and_then(P::str).is_none_or(str::is_empty) {
        return refuse(format!("remote_engine_id is {}", describe_opt::<P>(engine)));
    }
    match params.get(Key::RemoteBlockIds) {
        Some(ids) if block_ids::<P>(ids) => {}
        Some(ids) if P::items(ids).is_some() => {
            return refuse(
                "remote_block_ids holds an entry that is neither a non-negative integer nor an array of them (all entries of one kind)".into(),
            );
        }
        other => return refuse(format!("remote_block_ids is {}", describe_opt::<P>(other))),
    }
    if let Some(port) = params.get_non_nil(Key::RemotePort)
        && int_in::<P>(port, 1, 65535).is_none()
    {
        return refuse(format!("remote_port is {}", P::describe(port)));
    }
    Ok(())
}

/// vLLM's block IDs: one array of non-negative integers, or one such array
/// per KV-cache group (its `BlockIds`, a tuple or list of lists).
fn block_ids<'a, P: Params<'a>>(ids: P::Value) -> bool {
    let ints =
        |v: P::Value| P::items(v).is_some_and(|mut items| items.all(|i| P::uint(i).is_some()));
    ints(ids) || P::items(ids).is_some_and(|mut groups| groups.all(ints))
}

fn describe_opt<'a, P: Params<'a>>(value: Option<P::Value>) -> String {
    value.map_or_else(|| "missing".into(), P::describe)
}
