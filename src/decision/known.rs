//! The map keys the in-place decision looks up, recognized once per entry
//! as a map is read (see `fast.rs`): a lookup is then an index, not a scan
//! comparing every entry's key with the name, which a handoff would repeat
//! for every name it reads (`docs/performance.md`).

use super::handoff::{TRTLLM_KEYS, VLLM_KEYS};
use crate::wire::messages::DECODE_JOB_KEYS;

/// A key the decision reads or writes, by its index in [`NAMES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
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
}

/// Every recognized name: the [`Key`]s' names first, in their order, then
/// the other names of the key sets below (recognized only as members).
pub(super) const NAMES: [&str; 27] = [
    "request_id",
    "reply_to",
    "frames",
    "request",
    "error",
    "finish_reason",
    "disaggregated_params",
    "ctx_request_id",
    "request_type",
    "disagg_request_id",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "remote_engine_id",
    "remote_block_ids",
    "remote_port",
    "deadline_ms",
    "kv_expires_ms",
    "kv_transfer_params",
    // Members of sets only.
    "opaque_state",
    "first_gen_tokens",
    "encoded_opaque_state",
    "do_remote_prefill",
    "backend",
    "handoff",
    "prefill_output",
    "worker",
];

/// What a key span is: the index of its name in [`NAMES`], or [`OTHER`].
pub(super) type Kind = u8;
pub(super) const OTHER: Kind = u8::MAX;

/// A set of names, one bit per index in [`NAMES`].
pub(super) type Set = u32;

/// TensorRT-LLM's params keys (`handoff::TRTLLM_KEYS`).
pub(super) const TRTLLM: Set = set(&TRTLLM_KEYS);
/// vLLM's params keys (`handoff::VLLM_KEYS`).
pub(super) const VLLM: Set = set(&VLLM_KEYS);
/// Top-level keys not passed on into a decode job: the job's own and the
/// input's envelope.
pub(super) const NOT_PASSED_ON: Set =
    set(&DECODE_JOB_KEYS) | set(&["frames", "request", "request_id", "reply_to"]);

/// The set holding only `kind` (empty for [`OTHER`]). Without a branch:
/// a kind is below 32 ([`NAMES`] has at most 32 names, checked at build
/// time), and [`OTHER`]'s shift lands past the set's 32 bits. This runs for
/// every key a decision reads, so it stays branch-free.
#[inline(always)]
pub(super) fn bit(kind: Kind) -> Set {
    const { assert!(NAMES.len() <= Set::BITS as usize && OTHER & 63 >= 32) };
    (1u64 << (kind & 63)) as Set
}

/// Whether `kind` is in `set`.
pub(super) fn member(kind: Kind, set: Set) -> bool {
    set & bit(kind) != 0
}

/// The kind of a key span: a name of [`NAMES`] as a fixstr, or [`OTHER`].
#[cfg(test)]
pub(super) fn kind(key: &[u8]) -> Kind {
    classify(key).0
}

/// The kind of a key span and its bucket: one of 64, the same for equal
/// spans, different for any two names of [`NAMES`]; from one hash.
///
/// The span is compared with the one name of its slot as three words, not
/// by `memcmp`: a call per key cost more than the lookups it saves.
#[inline]
pub(super) fn classify(key: &[u8]) -> (Kind, usize) {
    let Some(slot) = hash(key) else {
        return (OTHER, key.len());
    };
    let candidate = &TABLE[slot];
    let (a, b) = (&candidate.words, words(key));
    // Word by word: compared as arrays, the words went through the stack
    // into vector registers, a stall per key.
    let differ = (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]);
    if candidate.span_len == key.len() && differ == 0 {
        (candidate.kind, slot)
    } else {
        (OTHER, slot)
    }
}

/// A span of 4 to 24 bytes as three words that together hold every byte:
/// its first, middle and last 8 bytes (which overlap below 24), or for a
/// span under 8 bytes its first and last 4. Equal for two spans of the same
/// length exactly when the spans are equal. Zeros for other lengths.
#[inline(always)]
const fn words(span: &[u8]) -> [u64; 3] {
    let n = span.len();
    if n >= 8 && n <= 24 {
        let mid = if n >= 16 { 8 } else { n - 8 };
        [word8(span, 0), word8(span, mid), word8(span, n - 8)]
    } else if n >= 4 && n < 8 {
        [word4(span, 0), word4(span, n - 4), 0]
    } else {
        [0; 3]
    }
}

/// The 8 bytes of `span` at `at` as a number (0 past the end: never, as
/// [`words`] calls it).
#[inline(always)]
const fn word8(span: &[u8], at: usize) -> u64 {
    match span.split_at(at).1.first_chunk::<8>() {
        Some(bytes) => u64::from_le_bytes(*bytes),
        None => 0,
    }
}

/// The 4 bytes of `span` at `at`, as [`word8`].
#[inline(always)]
const fn word4(span: &[u8], at: usize) -> u64 {
    match span.split_at(at).1.first_chunk::<4>() {
        Some(bytes) => u32::from_le_bytes(*bytes) as u64,
        None => 0,
    }
}

/// What a slot of [`TABLE`] holds: a name's span, as [`words`], and kind.
struct Slot {
    kind: Kind,
    span_len: usize,
    words: [u64; 3],
}

/// A key span's slot in [`TABLE`] (`None` for spans too short to be a
/// name): from its length and last two bytes, chosen so that no two names
/// share a slot (checked when [`TABLE`] is built).
#[inline]
const fn hash(key: &[u8]) -> Option<usize> {
    let n = key.len();
    if n < 3 {
        return None;
    }
    Some((n * 2 + key[n - 1] as usize * 19 + key[n - 2] as usize) & (SLOTS - 1))
}

const SLOTS: usize = 64;

/// Each slot's name, or none (a span length no key has); a build-time error
/// when two names share a slot (then change [`hash`]).
static TABLE: [Slot; SLOTS] = {
    const NONE: Slot = Slot {
        kind: OTHER,
        span_len: usize::MAX,
        words: [0; 3],
    };
    let mut table = [NONE; SLOTS];
    let mut i = 0;
    while i < NAMES.len() {
        let name = NAMES[i].as_bytes();
        assert!(
            name.len() >= 3 && name.len() < 24,
            "a recognized name is 3 to 23 bytes"
        );
        let mut span = [0u8; 32];
        span[0] = 0xa0 | name.len() as u8;
        let mut j = 0;
        while j < name.len() {
            span[j + 1] = name[j];
            j += 1;
        }
        let span = span.split_at(name.len() + 1).0;
        let Some(slot) = hash(span) else {
            panic!("a recognized name is too short");
        };
        assert!(
            table[slot].kind == OTHER,
            "two recognized names share a slot"
        );
        table[slot] = Slot {
            kind: i as Kind,
            span_len: span.len(),
            words: words(span),
        };
        i += 1;
    }
    table
};

/// The set of `names`, each of which must be in [`NAMES`] (a build-time
/// error otherwise).
pub(super) const fn set(names: &[&str]) -> Set {
    let mut set = 0;
    let mut i = 0;
    while i < names.len() {
        set |= 1 << index(names[i]);
        i += 1;
    }
    set
}

const fn index(name: &str) -> usize {
    let mut i = 0;
    while i < NAMES.len() {
        if eq(NAMES[i].as_bytes(), name.as_bytes()) {
            return i;
        }
        i += 1;
    }
    panic!("a key set names a key missing from NAMES")
}

const fn eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// `$name` as a MessagePack fixstr, built at compile time (a name under 32
/// bytes): the decision writes its own keys as constants. [`fixstrs!`] of one
/// name.
macro_rules! fixstr {
    ($name:expr) => {
        $crate::decision::known::fixstrs!($name)
    };
}
pub(super) use fixstr;

/// The names, each as a [`fixstr!`], one after the other, built at compile
/// time: a run of constant keys and values written with one copy.
macro_rules! fixstrs {
    ($($name:expr),+ $(,)?) => {{
        const NAMES: &[&str] = &[$($name),+];
        const LEN: usize = {
            let (mut len, mut i) = (0, 0);
            while i < NAMES.len() {
                assert!(NAMES[i].len() < 32, "a fixstr holds at most 31 bytes");
                len += NAMES[i].len() + 1;
                i += 1;
            }
            len
        };
        const SPANS: [u8; LEN] = {
            let mut spans = [0u8; LEN];
            let (mut at, mut i) = (0, 0);
            while i < NAMES.len() {
                let name = NAMES[i].as_bytes();
                spans[at] = 0xa0 | name.len() as u8;
                at += 1;
                let mut j = 0;
                while j < name.len() {
                    spans[at] = name[j];
                    at += 1;
                    j += 1;
                }
                i += 1;
            }
            spans
        };
        &SPANS
    }};
}
pub(super) use fixstrs;

/// `parts` one after the other, at compile time: constant runs of encoded
/// bytes that are not only fixstrs (a map header, `nil`). `N` must be their
/// total length (a build-time error otherwise).
pub(super) const fn join<const N: usize>(parts: &[&[u8]]) -> [u8; N] {
    let mut joined = [0u8; N];
    let (mut at, mut i) = (0, 0);
    while i < parts.len() {
        let mut j = 0;
        while j < parts[i].len() {
            joined[at] = parts[i][j];
            at += 1;
            j += 1;
        }
        i += 1;
    }
    assert!(at == N, "the parts' total length is not N");
    joined
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
    fn every_name_is_recognized_as_itself_and_nothing_else_is() {
        for (i, name) in NAMES.iter().enumerate() {
            assert_eq!(usize::from(kind(&span(name))), i, "{name}");
            // The same bytes without the fixstr marker, or with another
            // length, are not the key.
            assert_eq!(kind(name.as_bytes()), OTHER, "{name} unmarked");
            let mut longer = span(&format!("{name}x"));
            assert_eq!(kind(&longer), OTHER, "{name}x");
            longer.pop();
            assert_eq!(kind(&longer), OTHER, "{name} with a wrong length");
        }
        for other in ["", "a", "model", "request_i", "bootstrap_hosts", "text"] {
            assert_eq!(kind(&span(other)), OTHER, "{other}");
        }
        assert_eq!(kind(&[]), OTHER);
        assert_eq!(kind(&[0xa0]), OTHER);
    }

    #[test]
    fn each_kind_is_one_bit_of_a_set_and_other_none() {
        for i in 0..NAMES.len() {
            let kind = i as Kind;
            assert_eq!(bit(kind), 1 << i);
            assert!(member(kind, bit(kind)));
            assert!(!member(kind, !bit(kind)));
        }
        assert_eq!(bit(OTHER), 0);
        assert!(!member(OTHER, Set::MAX));
    }

    #[test]
    fn fixstrs_are_the_fixstrs_one_after_the_other() {
        assert_eq!(fixstrs!("backend"), fixstr!("backend"));
        let expected = [span("worker"), span(""), span("instance_id")].concat();
        assert_eq!(&fixstrs!("worker", "", "instance_id")[..], &expected[..]);
        let longest = "x".repeat(31);
        assert_eq!(
            &fixstrs!("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")[..],
            &span(&longest)[..]
        );
    }

    #[test]
    fn join_is_the_parts_one_after_the_other() {
        const JOINED: [u8; 12] = join(&[fixstr!("worker"), &[0x82], b"", fixstr!("id"), &[0xc0]]);
        let expected = [span("worker"), vec![0x82], span("id"), vec![0xc0]].concat();
        assert_eq!(&JOINED[..], &expected[..]);
    }

    #[test]
    fn the_keys_are_the_first_names_in_order() {
        let keys = [
            (Key::RequestId, "request_id"),
            (Key::ReplyTo, "reply_to"),
            (Key::Frames, "frames"),
            (Key::Request, "request"),
            (Key::Error, "error"),
            (Key::FinishReason, "finish_reason"),
            (Key::DisaggregatedParams, "disaggregated_params"),
            (Key::CtxRequestId, "ctx_request_id"),
            (Key::RequestType, "request_type"),
            (Key::DisaggRequestId, "disagg_request_id"),
            (Key::BootstrapHost, "bootstrap_host"),
            (Key::BootstrapPort, "bootstrap_port"),
            (Key::BootstrapRoom, "bootstrap_room"),
            (Key::RemoteEngineId, "remote_engine_id"),
            (Key::RemoteBlockIds, "remote_block_ids"),
            (Key::RemotePort, "remote_port"),
            (Key::DeadlineMs, "deadline_ms"),
        ];
        assert_eq!(keys.len(), Key::DeadlineMs as usize + 1);
        for (key, name) in keys {
            assert_eq!(NAMES[key as usize], name);
        }
    }

    #[test]
    fn the_sets_hold_exactly_their_names() {
        let members = |set: Set| -> Vec<&str> {
            (0..NAMES.len())
                .filter(|i| member(*i as Kind, set))
                .map(|i| NAMES[i])
                .collect()
        };
        let sorted = |names: &[&'static str]| {
            let mut names = names.to_vec();
            names.sort();
            names
        };
        assert_eq!(sorted(&members(TRTLLM)), sorted(&TRTLLM_KEYS));
        assert_eq!(sorted(&members(VLLM)), sorted(&VLLM_KEYS));
        let mut not_passed = DECODE_JOB_KEYS.to_vec();
        not_passed.push("frames");
        not_passed.sort();
        not_passed.dedup();
        assert_eq!(sorted(&members(NOT_PASSED_ON)), not_passed);
        assert!(!member(OTHER, Set::MAX));
    }

    #[test]
    fn fixstr_is_write_str() {
        assert_eq!(fixstr!("request_id").to_vec(), span("request_id"));
        assert_eq!(fixstr!("").to_vec(), span(""));
        assert_eq!(
            fixstr!("0123456789012345678901234567890").to_vec(),
            span("0123456789012345678901234567890")
        );
    }
}
