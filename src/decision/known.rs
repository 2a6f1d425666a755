//! The map keys the in-place decision looks up, recognized once per entry
//! as a map is read (see `fast.rs`): a lookup is then an index, not a scan
//! comparing every entry's key with the name, which a handoff would repeat
//! for every name it reads (`docs/performance.md`).

use crate::wire::messages::DECODE_JOB_KEYS;

/// What a map key is: a name the decision reads, or a member of one of the
/// key sets below, or [`Key::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Key {
    RequestId,
    ReplyTo,
    Frames,
    Request,
    Error,
    FinishReason,
    DisaggregatedParams,
    CtxRequestId,
    RequestType,
    DisaggRequestId,
    BootstrapHost,
    BootstrapPort,
    BootstrapRoom,
    RemoteEngineId,
    RemoteBlockIds,
    RemotePort,
    DeadlineMs,
    KvExpiresMs,
    KvTransferParams,
    OpaqueState,
    FirstGenTokens,
    EncodedOpaqueState,
    DoRemotePrefill,
    Backend,
    Handoff,
    PrefillOutput,
    Worker,
    /// Any other key, string or not.
    Other,
}

impl Key {
    /// The key whose name is `name`, or [`Key::Other`].
    pub(super) const fn named(name: &[u8]) -> Key {
        match name {
            b"request_id" => Key::RequestId,
            b"reply_to" => Key::ReplyTo,
            b"frames" => Key::Frames,
            b"request" => Key::Request,
            b"error" => Key::Error,
            b"finish_reason" => Key::FinishReason,
            b"disaggregated_params" => Key::DisaggregatedParams,
            b"ctx_request_id" => Key::CtxRequestId,
            b"request_type" => Key::RequestType,
            b"disagg_request_id" => Key::DisaggRequestId,
            b"bootstrap_host" => Key::BootstrapHost,
            b"bootstrap_port" => Key::BootstrapPort,
            b"bootstrap_room" => Key::BootstrapRoom,
            b"remote_engine_id" => Key::RemoteEngineId,
            b"remote_block_ids" => Key::RemoteBlockIds,
            b"remote_port" => Key::RemotePort,
            b"deadline_ms" => Key::DeadlineMs,
            b"kv_expires_ms" => Key::KvExpiresMs,
            b"kv_transfer_params" => Key::KvTransferParams,
            b"opaque_state" => Key::OpaqueState,
            b"first_gen_tokens" => Key::FirstGenTokens,
            b"encoded_opaque_state" => Key::EncodedOpaqueState,
            b"do_remote_prefill" => Key::DoRemotePrefill,
            b"backend" => Key::Backend,
            b"handoff" => Key::Handoff,
            b"prefill_output" => Key::PrefillOutput,
            b"worker" => Key::Worker,
            _ => Key::Other,
        }
    }

    /// The key a map key's span is: canonical MessagePack writes every name
    /// (under 32 bytes) as a fixstr, its length in the marker byte.
    #[inline]
    pub(super) fn of(span: &[u8]) -> Key {
        match span {
            [marker, name @ ..] if usize::from(*marker) == 0xa0 | name.len() => Key::named(name),
            _ => Key::Other,
        }
    }

    /// The set holding only this key.
    #[inline(always)]
    pub(super) const fn bit(self) -> Set {
        const { assert!((Key::Other as u32) < Set::BITS) };
        1 << self as u32
    }

    /// Whether this key is in `set`.
    pub(super) const fn is_in(self, set: Set) -> bool {
        set & self.bit() != 0
    }
}

/// A set of [`Key`]s, one bit each ([`Key::Other`]'s in none of those below).
pub(super) type Set = u32;

/// TensorRT-LLM's `DisaggregatedParams` fields that mark its shape;
/// trtllm-serve's JSON writes `opaque_state` base64-encoded as
/// `encoded_opaque_state`.
const TRTLLM_KEYS: [&str; 6] = [
    "ctx_request_id",
    "request_type",
    "disagg_request_id",
    "opaque_state",
    "first_gen_tokens",
    "encoded_opaque_state",
];
const VLLM_KEYS: [&str; 3] = ["do_remote_prefill", "remote_engine_id", "remote_block_ids"];
/// TensorRT-LLM's params keys: a params map with any of them is its shape.
pub(super) const TRTLLM: Set = set(&TRTLLM_KEYS);
/// vLLM's params keys.
pub(super) const VLLM: Set = set(&VLLM_KEYS);
/// The params keys whose values the engines' checks read
/// (`handoff::check_params`): a JSON result's are converted, not carried as
/// text (`fast_json`).
pub(super) const ENGINE_READS: Set = set(&[
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
/// Top-level keys not passed on into a decode job: the job's own and the
/// input's envelope.
pub(super) const NOT_PASSED_ON: Set =
    set(&DECODE_JOB_KEYS) | set(&["frames", "request", "request_id", "reply_to"]);

/// The set of `names`, each a [`Key`]'s (a build-time error otherwise).
pub(super) const fn set(names: &[&str]) -> Set {
    let (mut set, mut i) = (0, 0);
    while i < names.len() {
        let key = Key::named(names[i].as_bytes());
        assert!(!matches!(key, Key::Other), "a key set names no Key");
        set |= key.bit();
        i += 1;
    }
    set
}

/// `$name` as a MessagePack fixstr, built at compile time: a key the decision writes.
macro_rules! fixstr {
    ($name:expr) => {{
        const SPAN: [u8; $name.len() + 1] = $crate::decision::known::encode_fixstr($name);
        &SPAN
    }};
}
pub(super) use fixstr;

/// `name` as a fixstr of `N` bytes ([`fixstr!`]); a build-time error for a
/// name of 32 bytes or more.
pub(super) const fn encode_fixstr<const N: usize>(name: &str) -> [u8; N] {
    assert!(name.len() < 32, "a fixstr holds at most 31 bytes");
    let mut span = [0xa0 | name.len() as u8; N];
    span.split_at_mut(1).1.copy_from_slice(name.as_bytes());
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::msgpack::write_str;

    fn span(name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        write_str(&mut out, name.as_bytes());
        out
    }

    #[test]
    fn a_key_is_its_name_as_a_fixstr_and_nothing_else() {
        let rows: [(&[u8], Key); 11] = [
            (&span("request_id"), Key::RequestId),
            (&span("worker"), Key::Worker),
            (&span("disaggregated_params"), Key::DisaggregatedParams),
            (b"request_id", Key::Other),
            (b"\xa9request_id", Key::Other),
            (b"\xabrequest_id", Key::Other),
            (b"\xd9\x06frames", Key::Other),
            (&span("request_i"), Key::Other),
            (&span("model"), Key::Other),
            (b"\xa0", Key::Other),
            (b"", Key::Other),
        ];
        for (span, key) in rows {
            assert_eq!(Key::of(span), key, "{}", span.escape_ascii());
        }
    }

    #[test]
    fn each_set_holds_a_key_per_name() {
        let mut not_passed = DECODE_JOB_KEYS.to_vec();
        not_passed.extend(["frames", "request", "request_id", "reply_to"]);
        not_passed.sort();
        not_passed.dedup();
        for (set, names) in [
            (TRTLLM, &TRTLLM_KEYS[..]),
            (VLLM, &VLLM_KEYS[..]),
            (NOT_PASSED_ON, &not_passed[..]),
        ] {
            assert_eq!(set.count_ones() as usize, names.len(), "{names:?}");
            assert!(names.iter().all(|n| Key::of(&span(n)).is_in(set)));
        }
        assert!(!Key::Other.is_in(TRTLLM | VLLM | NOT_PASSED_ON));
    }

    #[test]
    fn fixstr_is_write_str() {
        assert_eq!(fixstr!("request_id")[..], span("request_id"));
        assert_eq!(fixstr!("")[..], span(""));
        let longest = fixstr!("0123456789012345678901234567890");
        assert_eq!(longest[..], span("0123456789012345678901234567890"));
    }
}
