//! The decision's cost is bounded by the input's bytes: no input, however
//! its values are shaped, makes it build a value tree of unbounded size.
//!
//! Memory is measured by a counting global allocator (this test binary's
//! own), not by wall clock: the peak of bytes allocated on the deciding
//! thread, above what was allocated before the call, must stay within
//! [`LIMIT`]. Before the bound, the 1 MiB million-`nil` result peaked near
//! 92 MB.

use crate::decision_support;

use decision_support::*;
use prefill_handoff::decision::{
    Backend, DeadLetterCode, Decision, ErrorCode, MAX_TREE_VALUES, Outcome, decide,
};
use prefill_handoff::wire::Encoding;
use serde_json::json;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The most bytes one decision may allocate beyond its input's own bytes.
const LIMIT: usize = 4 * 1024 * 1024;
/// The size of each hostile input: the contract's largest accepted message.
const MIB: usize = 1024 * 1024;

struct Counting;

thread_local! {
    static NOW: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(delta: isize) {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let _ = NOW.try_with(|now| {
        let n = now.get() + delta;
        now.set(n);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(n)));
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        // SAFETY: the caller's contract, passed on to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        // SAFETY: the caller's contract, passed on to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        // SAFETY: the caller's contract, passed on to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The decision and the peak bytes allocated while making it (the decision
/// itself, which holds the output, included).
fn measured(payload: &[u8], encoding: Encoding) -> (Decision, usize) {
    let rules = rules();
    let mut ids = TestIds::holding_slot();
    let input = input(payload, encoding);
    let before = NOW.with(Cell::get);
    PEAK.with(|p| p.set(before));
    let decision = decide(input, &rules, &mut ids);
    let peak = PEAK.with(Cell::get) - before;
    (decision, usize::try_from(peak).unwrap_or(0))
}

/// `{request_id, reply_to, frames: [first]}` in MessagePack, where the first
/// frame's `token_ids` is an array of `nil` filling the body to exactly
/// `size` bytes.
fn msgpack_nils(first: &[(&str, &str)], size: usize) -> Vec<u8> {
    msgpack_items(first, &[0xc0], size)
}

/// Like [`msgpack_nils`], with each item encoded as `item`, as many as fit.
fn msgpack_items(first: &[(&str, &str)], item: &[u8], size: usize) -> Vec<u8> {
    let mut head = Vec::new();
    let str8 = |out: &mut Vec<u8>, s: &str| {
        assert!(s.len() < 32);
        out.push(0xa0 | s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    };
    head.push(0x83);
    str8(&mut head, "request_id");
    str8(&mut head, "r-1");
    str8(&mut head, "reply_to");
    str8(&mut head, REPLY);
    str8(&mut head, "frames");
    head.push(0x91);
    head.push(0x80 | (first.len() as u8 + 1));
    for (k, v) in first {
        str8(&mut head, k);
        str8(&mut head, v);
    }
    str8(&mut head, "token_ids");
    let n = (size - head.len() - 5) / item.len();
    head.push(0xdd);
    head.extend_from_slice(&(n as u32).to_be_bytes());
    for _ in 0..n {
        head.extend_from_slice(item);
    }
    head
}

/// A JSON body of exactly `size` bytes: `prefix`, then `item,` repeated, then
/// `suffix` (padded with spaces, which JSON ignores).
fn json_filled(prefix: &str, item: &str, suffix: &str, size: usize) -> Vec<u8> {
    let mut out = prefix.as_bytes().to_vec();
    let room = size - prefix.len() - suffix.len();
    let n = room / (item.len() + 1);
    for i in 0..n {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item.as_bytes());
    }
    out.extend_from_slice(suffix.as_bytes());
    out.resize(size, b' ');
    out
}

fn is_refused_as_too_complex(d: &Decision) -> bool {
    d.outcome
        == (Outcome::Error {
            code: ErrorCode::Malformed,
        })
        && &*d.subject == REPLY
        && d.request_id.as_deref() == Some("r-1")
        && d.detail
            .as_deref()
            .is_some_and(|why| why.contains(&MAX_TREE_VALUES.to_string()))
}

#[test]
fn a_million_nil_needing_decode_is_refused_within_the_memory_bound() {
    // No disaggregated_params: the in-place path declines (an error outcome),
    // and a tree of it would hold a million values.
    let body = msgpack_nils(&[], MIB);
    let (d, peak) = measured(&body, Encoding::MsgPack);
    assert!(is_refused_as_too_complex(&d), "{d:?}");
    assert!(peak <= LIMIT, "peak {peak} bytes");
}

#[test]
fn a_million_nil_terminal_result_is_answered_in_place_within_the_memory_bound() {
    let body = msgpack_nils(&[("finish_reason", "stop")], MIB);
    let (d, peak) = measured(&body, Encoding::MsgPack);
    assert!(matches!(d.outcome, Outcome::Terminal { .. }), "{d:?}");
    assert!(d.payload.len() > MIB - 64, "the frame is passed on whole");
    assert!(peak <= LIMIT, "peak {peak} bytes");
}

#[test]
fn non_canonical_msgpack_of_many_values_is_refused_within_the_memory_bound() {
    // The same shape, each item an integer in a wider encoding than needed
    // (0xcf + 8 bytes): the in-place path reads canonical bodies only.
    let body = msgpack_items(
        &[("finish_reason", "stop")],
        &[0xcf, 0, 0, 0, 0, 0, 0, 0, 1],
        MIB,
    );
    assert!(body.len() <= MIB);
    let (d, peak) = measured(&body, Encoding::MsgPack);
    assert!(is_refused_as_too_complex(&d), "{d:?}");
    assert!(peak <= LIMIT, "peak {peak} bytes");
}

#[test]
fn hostile_json_shapes_are_refused_within_the_memory_bound() {
    let head = format!(r#"{{"request_id":"r-1","reply_to":"{REPLY}","frames":[{{"x":["#);
    let shapes = [
        ("nulls", json_filled(&head, "null", "]}]}", MIB)),
        ("empty maps", json_filled(&head, "{}", "]}]}", MIB)),
        (
            "nested arrays",
            json_filled(&head, "[[[[[[[[0]]]]]]]]", "]}]}", MIB),
        ),
        ("zeros", json_filled(&head, "0", "]}]}", MIB)),
        // Spaced as Python writes JSON: carried once compacted.
        ("spaced zeros", json_filled(&head, " 0", "]}]}", MIB)),
        (
            "spaced nested arrays",
            json_filled(&head, "[ [ [ [ 0 ] ] ] ]", "]}]}", MIB),
        ),
    ];
    for (name, body) in shapes {
        assert_eq!(body.len(), MIB);
        let (d, peak) = measured(&body, Encoding::Json);
        assert!(is_refused_as_too_complex(&d), "{name}: {d:?}");
        assert!(peak <= LIMIT, "{name}: peak {peak} bytes");
    }
}

#[test]
fn too_complex_without_a_usable_reply_subject_is_dead_lettered() {
    let body = json_filled(r#"{"frames":[{"x":["#, "null", "]}]}", MIB);
    let (d, peak) = measured(&body, Encoding::Json);
    assert_eq!(
        d.outcome,
        Outcome::DeadLetter {
            code: DeadLetterCode::MissingReplyTo
        }
    );
    assert_eq!(&*d.subject, DEAD);
    assert_eq!(d.payload, body, "a dead letter carries the original bytes");
    assert!(
        peak <= LIMIT + MIB,
        "peak {peak} bytes (the copy of the input included)"
    );
    let not_a_map = json_filled("[", "null", "]", MIB);
    let (d, _) = measured(&not_a_map, Encoding::Json);
    assert_eq!(
        d.outcome,
        Outcome::DeadLetter {
            code: DeadLetterCode::Malformed
        }
    );
}

#[test]
fn json_results_within_the_value_bound_are_decided_as_before() {
    // A request carrying its prompt's token IDs, read as a tree: just past a
    // power of two (the array's buffer doubles, old and new both live for a
    // moment) and just under the bound. Both within the memory bound.
    for count in [MAX_TREE_VALUES / 2 + 1, MAX_TREE_VALUES - 100] {
        let tokens: Vec<u32> = (0..count as u32).collect();
        let body = serde_json::to_vec(&json!({
            "request_id": "r-1",
            "reply_to": REPLY,
            "frames": [{"token_ids": [7], "disaggregated_params": {"ctx_request_id": 5}}],
            "request": {"token_ids": tokens},
        }))
        .unwrap();
        let (d, peak) = measured(&body, Encoding::Json);
        assert!(
            matches!(d.outcome, Outcome::Decode { .. }),
            "{count}: {d:?}"
        );
        assert!(peak <= LIMIT, "{count}: peak {peak} bytes");
    }
}

#[test]
fn a_long_prompt_in_an_sglang_or_vllm_handoff_is_handed_off_in_place() {
    // 100,000 token IDs in the request: three times the value-tree bound.
    // Before SGLang and vLLM handoffs were decided in place, such a result
    // was refused as too complex; TensorRT-LLM's already passed.
    let tokens: Vec<u32> = (0..100_000).collect();
    for (params, backend) in [
        (sglang(), Backend::Sglang),
        (vllm(), Backend::Vllm),
        (trt(), Backend::Trtllm),
    ] {
        let body = msgpack(&v(json!({
            "request_id": "r-1",
            "reply_to": REPLY,
            "frames": [{"token_ids": [7], "finish_reason": "length", "disaggregated_params": params}],
            "request": {"model": "m", "token_ids": tokens},
        })));
        let (d, peak) = measured(&body, Encoding::MsgPack);
        assert!(
            matches!(d.outcome, Outcome::Decode { backend: b, .. } if b == backend),
            "{backend}: {:?} {:?}",
            d.outcome,
            d.detail
        );
        assert!(
            d.payload.len() > body.len(),
            "{backend}: the request is passed on whole"
        );
        assert!(peak <= LIMIT, "{backend}: peak {peak} bytes");
    }
}

/// A TensorRT-LLM handoff with the ID its context phase ran with, as in the
/// shapes below.
fn trt_with_id() -> serde_json::Value {
    json!({"ctx_request_id": 7, "request_type": "context_only", "disagg_request_id": 1_099_511_627_777u64,
           "opaque_state": "AAEC", "first_gen_tokens": [42]})
}

/// `n` keys `x0`, `x1`, ... with small values, into `map`.
fn widen(map: &mut serde_json::Value, n: usize) {
    for i in 0..n {
        map[format!("x{i}")] = json!(i);
    }
}

/// The shapes real results have and a value-count bound used to refuse:
/// a result of 17 top-level keys with a 33,000-token prompt in `request`, a
/// first frame of 24 keys with 50,000 token IDs, params of 24 keys with
/// 50,000 draft tokens. Each is decided, in MessagePack and in JSON, within
/// the memory bound.
#[test]
fn long_prompts_in_wide_maps_are_decided_in_both_encodings() {
    let tokens = |n: u32| (0..n).collect::<Vec<u32>>();
    let base = || {
        json!({
            "request_id": "r-1",
            "reply_to": REPLY,
            "frames": [{"token_ids": [7], "finish_reason": "length", "disaggregated_params": trt_with_id()}],
        })
    };
    let mut wide_top = base();
    wide_top["request"] = json!({"model": "m", "prompt_token_ids": tokens(33_000)});
    widen(&mut wide_top, 13);
    let mut wide_frame = base();
    wide_frame["frames"][0]["token_ids"] = json!(tokens(50_000));
    widen(&mut wide_frame["frames"][0], 21);
    let mut wide_params = base();
    wide_params["frames"][0]["disaggregated_params"]["draft_tokens"] = json!(tokens(50_000));
    widen(&mut wide_params["frames"][0]["disaggregated_params"], 18);
    assert_eq!(wide_top.as_object().map(|m| m.len()), Some(17));
    assert_eq!(
        wide_frame["frames"][0].as_object().map(|m| m.len()),
        Some(24)
    );
    assert_eq!(
        wide_params["frames"][0]["disaggregated_params"]
            .as_object()
            .map(|m| m.len()),
        Some(24)
    );
    for (name, result) in [
        ("top", wide_top),
        ("frame", wide_frame),
        ("params", wide_params),
    ] {
        for (encoding, body) in [
            (Encoding::MsgPack, msgpack(&v(result.clone()))),
            (Encoding::Json, serde_json::to_vec(&result).unwrap()),
        ] {
            let (d, peak) = measured(&body, encoding);
            assert_eq!(
                d.outcome,
                Outcome::Decode {
                    backend: Backend::Trtllm,
                    minted: false
                },
                "{name} {encoding:?}: {:?}",
                d.detail
            );
            assert!(peak <= LIMIT, "{name} {encoding:?}: peak {peak} bytes");
        }
    }
}

/// A 1 MiB map of hundreds of thousands of keys is not decided in place
/// (a map of more than 4,096 entries takes the tree path) and is refused
/// within the memory bound, like any other result of too many values.
#[test]
fn a_map_of_a_quarter_million_keys_is_refused_within_the_memory_bound() {
    let mut body = vec![0x83];
    for (k, v) in [("request_id", "r-1"), ("reply_to", REPLY)] {
        body.push(0xa0 | k.len() as u8);
        body.extend_from_slice(k.as_bytes());
        body.push(0xa0 | v.len() as u8);
        body.extend_from_slice(v.as_bytes());
    }
    body.push(0xa6);
    body.extend_from_slice(b"frames");
    body.push(0x91);
    // The first frame: a map of `n` distinct 4-byte keys (fixstr "kNNN"
    // as a 3-byte base-256 number) with nil values.
    let n: u32 = 200_000;
    body.push(0xdf);
    body.extend_from_slice(&n.to_be_bytes());
    for i in 0..n {
        body.push(0xa3);
        body.extend_from_slice(&i.to_be_bytes()[1..]);
        body.push(0xc0);
    }
    assert!(body.len() <= MIB);
    let (d, peak) = measured(&body, Encoding::MsgPack);
    assert!(
        is_refused_as_too_complex(&d),
        "{:?} {:?}",
        d.outcome,
        d.detail
    );
    assert!(peak <= LIMIT, "peak {peak} bytes");
}
