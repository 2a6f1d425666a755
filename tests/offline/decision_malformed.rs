//! Malformed prefill results whose reply subject is known and allowed: an
//! error `malformed` (or the specific code) to the reply subject, with the
//! request ID when it was usable (contract 4.2).

use crate::decision_support;

use decision_support::*;
use prefill_handoff::decision::{ErrorCode, Outcome};
use prefill_handoff::wire::Encoding;
use rmpv::Value;
use serde_json::{Value as Json, json};

#[test]
fn malformed_results_with_a_known_reply_subject_get_an_error() {
    let good_frames = json!([frame(Some(json!("length")), Some(trt()))]);
    let long_id = "x".repeat(257);
    let rows: Vec<(&str, Json)> = vec![
        (
            "request_id missing",
            json!({"reply_to": REPLY, "frames": good_frames}),
        ),
        (
            "request_id null",
            json!({"request_id": null, "reply_to": REPLY, "frames": good_frames}),
        ),
        (
            "request_id an integer",
            json!({"request_id": 5, "reply_to": REPLY, "frames": good_frames}),
        ),
        (
            "request_id empty",
            json!({"request_id": "", "reply_to": REPLY, "frames": good_frames}),
        ),
        (
            "request_id 257 bytes",
            json!({"request_id": long_id, "reply_to": REPLY, "frames": good_frames}),
        ),
        (
            "frames missing",
            json!({"request_id": "req-1", "reply_to": REPLY}),
        ),
        (
            "frames null",
            json!({"request_id": "req-1", "reply_to": REPLY, "frames": null}),
        ),
        (
            "frames a map",
            json!({"request_id": "req-1", "reply_to": REPLY, "frames": {"0": {}}}),
        ),
        ("first frame not a map", result(json!(["eos"]))),
        (
            "later frame not a map",
            result(json!([frame(Some(json!("eos")), None), 5])),
        ),
        (
            "request not a map",
            with(result(good_frames.clone()), "request", json!("prompt")),
        ),
    ];
    for (name, message) in rows {
        let d = decide_json_as_msgpack(message);
        check(name, &d, Expect::Error(ErrorCode::Malformed));
    }
    let ok = decide_json_as_msgpack(with(
        result(good_frames.clone()),
        "request_id",
        json!("y".repeat(256)),
    ));
    assert!(
        matches!(ok.outcome, Outcome::Decode { .. }),
        "256 bytes is fine"
    );
    let null_request = decide_json_as_msgpack(with(result(good_frames), "request", Json::Null));
    assert!(matches!(null_request.outcome, Outcome::Decode { .. }));
}

/// Keys that appear twice could be read one way here and another way by the
/// decode worker.
#[test]
fn duplicated_keys_are_malformed() {
    let k = Value::from;
    let first_frame = |extra: Vec<(Value, Value)>| {
        let mut f = vec![(k("finish_reason"), k("length"))];
        f.push((k("disaggregated_params"), v(trt())));
        f.extend(extra);
        Value::Map(f)
    };
    let message = |frame: Value, extra: Vec<(Value, Value)>| {
        let mut m = vec![
            (k("request_id"), k("req-1")),
            (k("reply_to"), k(REPLY)),
            (k("frames"), Value::Array(vec![frame])),
        ];
        m.extend(extra);
        Value::Map(m)
    };
    let mut params = match v(trt()) {
        Value::Map(m) => m,
        _ => unreachable!(),
    };
    params.push((k("ctx_request_id"), Value::from(8)));
    let rows = [
        (
            "top level",
            message(
                first_frame(vec![]),
                vec![(k("frames"), Value::Array(vec![]))],
            ),
        ),
        (
            "first frame",
            message(first_frame(vec![(k("finish_reason"), k("eos"))]), vec![]),
        ),
        (
            "params",
            message(
                Value::Map(vec![(k("disaggregated_params"), Value::Map(params))]),
                vec![],
            ),
        ),
    ];
    for (name, m) in rows {
        check(
            name,
            &decide_msgpack(&m),
            Expect::Error(ErrorCode::Malformed),
        );
    }
    // JSON keeps duplicated keys too, so they are caught the same way.
    let json_twice =
        br#"{"request_id": "r", "reply_to": "_INBOX.a", "frames": [], "frames": [{}]}"#;
    let d = decide_bytes(json_twice, Encoding::Json, &rules(), None);
    assert_eq!(
        d.outcome,
        Outcome::Error {
            code: ErrorCode::Malformed
        }
    );
    let json_reply_twice =
        br#"{"request_id": "r", "reply_to": "_INBOX.a", "reply_to": "_INBOX.b", "frames": []}"#;
    let d = decide_bytes(json_reply_twice, Encoding::Json, &rules(), None);
    assert_eq!(d.outcome.kind(), "dead_letter");
    // A duplicated request_id: which one is meant cannot be known.
    let twice = message(first_frame(vec![]), vec![(k("request_id"), k("req-2"))]);
    let d = decide_msgpack(&twice);
    assert_eq!(d.request_id, None);
}

#[test]
fn errors_name_the_request_and_say_what_was_wrong() {
    let d = decide_json_as_msgpack(result(json!([{"error": "CUDA out of memory on GPU 3"}])));
    let b = body(&d, Encoding::MsgPack);
    let message = path(&b, &["error", "message"]).and_then(Value::as_str);
    assert!(
        message.is_some_and(|m| m.contains("CUDA out of memory on GPU 3")),
        "{message:?}"
    );
    assert_eq!(
        field(&b, "request_id").and_then(Value::as_str),
        Some("req-1")
    );
    assert_eq!(d.request_id.as_deref(), Some("req-1"));

    let d = decide_json_as_msgpack(result(
        json!([{"error": {"message": "engine died", "code": 13}}]),
    ));
    let b = body(&d, Encoding::MsgPack);
    let message = path(&b, &["error", "message"]).and_then(Value::as_str);
    assert!(
        message.is_some_and(|m| m.contains("engine died")),
        "{message:?}"
    );

    // A malformed result still carries its request_id when it had a good one.
    let d = decide_json_as_msgpack(json!({"request_id": "req-9", "reply_to": REPLY, "frames": 3}));
    let b = body(&d, Encoding::MsgPack);
    assert_eq!(
        field(&b, "request_id").and_then(Value::as_str),
        Some("req-9")
    );
    // ... and null when it had none.
    let d = decide_json_as_msgpack(json!({"reply_to": REPLY, "frames": []}));
    let b = body(&d, Encoding::MsgPack);
    assert_eq!(field(&b, "request_id"), Some(&Value::Nil));

    let d = decide_json_as_msgpack(needs_decode(with(trt(), "ctx_request_id", Json::Null)));
    let message = d.detail.unwrap_or_default();
    assert!(message.contains("ctx_request_id"), "{message}");
}
