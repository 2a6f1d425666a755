//! The in-place JSON path decides exactly as the value-tree path does:
//! same outcome, subject, headers, payload bytes and counts, and the same IDs
//! minted — for generated results near the contract's shapes written as
//! JSON, written as other producers write JSON (whitespace, escapes,
//! numbers in other forms), and for hostile edits of them at the token and
//! the byte level.

use crate::decision_fast::{check_same_in, deadline_header, engine_params, field_of, gen_result};
use crate::decision_support::*;
use prefill_handoff::decision::decide_in_place;
use prefill_handoff::wire::{self, Encoding, MAX_DEPTH};
use proptest::prelude::*;
use rmpv::Value;

fn json(value: &Value) -> Vec<u8> {
    wire::encode(value, Encoding::Json)
}

fn check_same(payload: &[u8], header: Option<&str>) -> Result<(), TestCaseError> {
    check_same_in(payload, Encoding::Json, header)
}

/// Pieces of JSON that other producers write, or that break a rule: white
/// space, escapes (of plain characters, of slashes, lone surrogates),
/// numbers in forms serde_json reads differently from an integer, structure,
/// and bytes that are not UTF-8.
const SNIPPETS: [&[u8]; 26] = [
    b" ",
    b"\n\t",
    b"\\u0041",
    b"\\u005f",
    b"\\n",
    b"\\/",
    b"\\ud800",
    b"\\ud83d\\ude00",
    b"\"",
    b",",
    b":",
    b"[",
    b"]",
    b"{",
    b"}",
    b"0",
    b"-0",
    b".5",
    b"e3",
    b"1e400",
    b"18446744073709551616",
    b"1.0",
    "é".as_bytes(),
    b"\xff",
    b"\x01",
    b"null",
];

/// Whole-token rewrites: a key spelled with an escape (a duplicate the
/// bytes do not show), integers as floats, and Python's separators.
const REWRITES: [(&str, &str); 8] = [
    ("\"request_id\"", "\"request\\u005fid\""),
    ("\"reply_to\"", "\"reply\\u005fto\""),
    ("\"ctx_request_id\"", "\"ctx\\u005frequest_id\""),
    ("\"ctx_request_id\":7", "\"ctx_request_id\":7.0"),
    ("\"deadline_ms\":", "\"deadline_ms\":1e0+"),
    (":", ": "),
    (",", ", "),
    ("\"_INBOX.client.1\"", "\"_INBOX.client.\\u0031\""),
];

/// `bytes` with `edits` applied: each inserts or overwrites a snippet, or
/// inserts, overwrites or removes one byte.
fn edited(mut bytes: Vec<u8>, edits: &[(prop::sample::Index, u8, u8)]) -> Vec<u8> {
    for (at, pick, how) in edits {
        if bytes.is_empty() {
            break;
        }
        let i = at.index(bytes.len());
        let snippet = SNIPPETS[usize::from(*pick) % SNIPPETS.len()];
        match how % 5 {
            0 => {
                bytes.splice(i..i, snippet.iter().copied());
            }
            1 => {
                let end = (i + snippet.len()).min(bytes.len());
                bytes.splice(i..end, snippet.iter().copied());
            }
            2 => bytes[i] = *pick,
            3 => bytes.insert(i, *pick),
            _ => {
                bytes.remove(i);
            }
        }
    }
    bytes
}

/// `text` with the rewrites chosen by `mask` applied to every occurrence.
fn rewritten(text: &str, mask: u8) -> String {
    let mut text = text.to_string();
    for (i, (from, to)) in REWRITES.iter().enumerate() {
        if mask & (1 << i) != 0 {
            text = text.replace(from, to);
        }
    }
    text
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn generated_json_results_decide_the_same(
        message in gen_result(),
        header in deadline_header(),
    ) {
        check_same(&json(&message), header.as_deref())?;
    }

    #[test]
    fn json_engine_handoffs_decide_the_same(
        params in engine_params(),
        ctx in field_of(vec![Value::from(7), Value::F64(7.0), Value::from(-1), Value::Nil]),
        header in deadline_header(),
    ) {
        let mut params = params;
        if let (Value::Map(entries), Some(ctx)) = (&mut params, ctx) {
            entries.push((Value::from("ctx_request_id"), ctx));
        }
        let frame = Value::Map(vec![
            (Value::from("token_ids"), Value::Array(vec![Value::from(791)])),
            (Value::from("finish_reason"), Value::from("length")),
            (Value::from("disaggregated_params"), params),
        ]);
        let message = Value::Map(vec![
            (Value::from("request_id"), Value::from("req-1")),
            (Value::from("reply_to"), Value::from(REPLY)),
            (Value::from("frames"), Value::Array(vec![frame])),
        ]);
        check_same(&json(&message), header.as_deref())?;
    }

    #[test]
    fn rewritten_json_results_decide_the_same(
        message in gen_result(),
        mask in any::<u8>(),
        header in deadline_header(),
    ) {
        let text = String::from_utf8_lossy(&json(&message)).into_owned();
        check_same(rewritten(&text, mask).as_bytes(), header.as_deref())?;
    }

    #[test]
    fn edited_json_bytes_decide_the_same(
        message in gen_result(),
        header in deadline_header(),
        edits in proptest::collection::vec(
            (any::<prop::sample::Index>(), any::<u8>(), any::<u8>()),
            1..4,
        ),
    ) {
        check_same(&edited(json(&message), &edits), header.as_deref())?;
    }
}

/// Typical results, as serde_json, Go and JavaScript write them and as
/// Python's `json.dumps` does by default (spaces after separators, non-ASCII
/// escaped), are decided in place — so the equality above covers the
/// in-place path, not just the fallback — and decided as the tree decides.
#[test]
fn typical_json_results_are_decided_in_place() {
    let prefill_error = {
        let mut frame = frame(Some(serde_json::json!("error")), None);
        frame["error"] = serde_json::json!("CUDA error: out of memory");
        result(serde_json::json!([frame]))
    };
    let cases = [
        (needs_decode(without(trt(), "disagg_request_id")), "decode"),
        (needs_decode(trt()), "decode"),
        (
            result(serde_json::json!([frame(
                Some(serde_json::json!("stop")),
                Some(trt())
            )])),
            "terminal",
        ),
        (needs_decode(sglang()), "decode"),
        (needs_decode(vllm()), "decode"),
        (needs_decode(without(trt(), "ctx_request_id")), "error"),
        (prefill_error, "error"),
    ];
    for (message, kind) in cases {
        let compact = serde_json::to_vec(&message).unwrap();
        let text = String::from_utf8(compact.clone()).unwrap();
        let python = rewritten(&text, 0b0110_0000);
        let escaped = text.replace("Hi", "H\\u0069").replace("/", "\\/");
        for body in [compact, python.into_bytes(), escaped.into_bytes()] {
            let d = decide_in_place(
                input(&body, Encoding::Json),
                &rules(),
                &mut TestIds::holding_slot(),
            )
            .unwrap_or_else(|| panic!("a typical {kind} result is decided in place"));
            assert_eq!(d.outcome.kind(), kind);
            assert_eq!(header(&d, "Content-Type"), Some("application/json"));
            check_same(&body, None).unwrap();
        }
    }
}

/// Hostile JSON stays within its bounds: refused (by the in-place reader
/// and then by the tree) rather than read past them.
#[test]
fn hostile_json_is_refused_in_place_and_answered_by_the_tree() {
    let head = format!(
        r#"{{"request_id":"r-1","reply_to":"{REPLY}","frames":[{{"finish_reason":"stop","x":"#
    );
    let nested =
        |levels: usize| format!("{head}{}0{}}}]}}", "[".repeat(levels), "]".repeat(levels));
    // The top level, the frames array and the frame are three levels.
    let at_bound = nested(MAX_DEPTH - 3).into_bytes();
    let past_bound = nested(MAX_DEPTH - 2).into_bytes();
    let mib_of_arrays = nested(512 * 1024).into_bytes();
    let long_string = format!(
        r#"{{"request_id":"r-1","reply_to":"{REPLY}","frames":[{{"finish_reason":"stop","text":"{}"}}]}}"#,
        "x".repeat(1024 * 1024 - 200)
    )
    .into_bytes();
    let duplicate = format!(
        r#"{{"request_id":"r-1","reply_to":"{REPLY}","frames":[{{"finish_reason":"stop","finish_reason":"length"}}]}}"#
    )
    .into_bytes();
    let escaped_duplicate = format!(
        r#"{{"request_id":"r-1","reply_to":"{REPLY}","reply\u005fto":"_INBOX.other","frames":[]}}"#
    )
    .into_bytes();
    for (name, body, in_place, outcome) in [
        ("at the depth bound", at_bound, true, "terminal"),
        ("past the depth bound", past_bound, false, "dead_letter"),
        (
            "1 MiB of nested arrays",
            mib_of_arrays,
            false,
            "dead_letter",
        ),
        ("a 1 MiB string", long_string, true, "terminal"),
        ("a frame key twice", duplicate, false, "error"),
        (
            "reply_to twice, once escaped",
            escaped_duplicate,
            false,
            "dead_letter",
        ),
    ] {
        let d = decide_in_place(
            input(&body, Encoding::Json),
            &rules(),
            &mut TestIds::holding_slot(),
        );
        assert_eq!(d.is_some(), in_place, "{name}");
        let d = decide_bytes(&body, Encoding::Json, &rules(), None);
        assert_eq!(d.outcome.kind(), outcome, "{name}: {d:?}");
        check_same(&body, None).unwrap();
    }
}

/// The values of a `request` map are carried through as their JSON text
/// when that text is what writing them back would give, and converted
/// otherwise: every form of number, string and nesting decides as the tree
/// decides, and a decode job is still decided in place.
#[test]
fn request_values_in_every_form_decide_the_same() {
    let values = [
        "0",
        "7",
        "-1",
        "-0",
        "01",
        "9999999999999999999",
        "18446744073709551615",
        "18446744073709551616",
        "-999999999999999999",
        "-9223372036854775808",
        "-92233720368547758080",
        "0.7",
        "0.95",
        "1.0",
        "1.00",
        "100.0",
        "1e3",
        "1E+2",
        "-0.0",
        "0.1e-7",
        "1e-7",
        "1e400",
        "5e-324",
        "1.7976931348623157e308",
        "true",
        "false",
        "null",
        r#""m""#,
        r#""é""#,
        r#""\u00e9""#,
        r#""a\/b""#,
        r#""\ud800""#,
        "\"\u{1}\"",
        "[]",
        "{}",
        "[1,2,3]",
        "[1, 2]",
        r#"{"a":1,"a":2}"#,
        r#"{"a" :1}"#,
        r#"[[[[0]]]]"#,
        r#"{"t":[0.5,-3,"x",null]}"#,
        "[1,]",
        "tru",
        r#"{"temperature":0.7,"top_p":1}"#,
        r#"{"k":"1e400","n":[2E5]}"#,
        r#"["x","\ud800"]"#,
        r#"["1e5",0]"#,
    ];
    // The top level, `request` and the value's own container are three.
    let deep = |levels: usize| format!("{}0{}", "[".repeat(levels), "]".repeat(levels));
    let mut texts: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    texts.extend([deep(MAX_DEPTH - 2), deep(MAX_DEPTH - 1), deep(MAX_DEPTH)]);
    // Integers past an f64's range have 309 digits or more.
    for digits in [300, 301, 308, 309, 400] {
        texts.push("9".repeat(digits));
        texts.push(format!("[{}]", "9".repeat(digits)));
        texts.push(format!("0.{}", "9".repeat(digits)));
    }
    let job = serde_json::to_string(&needs_decode(trt())).unwrap();
    let head = job.strip_suffix('}').unwrap();
    for value in &texts {
        let body = format!(r#"{head},"request":{{"model":"m","v":{value},"w":[{value}]}}}}"#);
        check_same(body.as_bytes(), None).unwrap_or_else(|e| panic!("{value}: {e}"));
        let tree = decide_bytes(body.as_bytes(), Encoding::Json, &rules(), None);
        if tree.outcome.kind() == "decode" {
            let d = decide_in_place(
                input(body.as_bytes(), Encoding::Json),
                &rules(),
                &mut TestIds::holding_slot(),
            );
            assert!(d.is_some(), "{value}: a decode job is decided in place");
        }
    }
}
