//! The decision, rule by rule (contract 4.2): one table row per case, in the
//! contract's order. Malformed results are in `decision_malformed.rs`,
//! backend validation in `decision_handoff.rs`, the decode job in
//! `decision_job.rs`, dead letters and reply subjects in
//! `decision_dead_letter.rs`.

use crate::decision_support;

use decision_support::*;
use prefill_handoff::decision::{Backend, ErrorCode, FinishReason};
use prefill_handoff::wire::Encoding;
use rmpv::Value;
use serde_json::{Value as Json, json};

#[test]
fn the_first_frame_decides() {
    use Expect::*;
    use FinishReason as R;
    let decode = Decode(Backend::Trtllm);
    // A first frame with a finish_reason and valid TensorRT-LLM params.
    let first = |reason: Json| frame(Some(reason), Some(trt()));
    let only = |f: Json| result(json!([f]));
    let then = |f: Json, later: Json| result(json!([f, later]));
    let failed = |f: Json| with(f, "error", json!("boom"));
    #[rustfmt::skip]
    let rows: Vec<(&str, Json, Expect)> = vec![
        // Rule 1: no frames.
        ("frames empty", result(json!([])), Error(ErrorCode::NoOutput)),
        // Rule 2: the first frame is an error event.
        ("first frame has error (string)", only(json!({"error": "CUDA out of memory"})), Error(ErrorCode::PrefillFailed)),
        ("first frame has error (map)", only(json!({"error": {"message": "engine died"}})), Error(ErrorCode::PrefillFailed)),
        ("error wins over a terminal finish_reason", only(failed(first(json!("eos")))), Error(ErrorCode::PrefillFailed)),
        ("error wins over a decode finish_reason", only(failed(first(json!("length")))), Error(ErrorCode::PrefillFailed)),
        // Rule 3: finished already → terminal, whatever the params say.
        ("eos", only(first(json!("eos"))), Terminal(R::Eos)),
        ("stop", only(first(json!("stop"))), Terminal(R::Stop)),
        ("cancelled", only(first(json!("cancelled"))), Terminal(R::Cancelled)),
        ("abort", only(first(json!("abort"))), Terminal(R::Abort)),
        ("content_filter", only(first(json!("content_filter"))), Terminal(R::ContentFilter)),
        ("\"error\" string", only(first(json!("error"))), Terminal(R::Error)),
        ("{\"error\": ...}", only(first(json!({"error": "kv transfer failed"}))), Terminal(R::Error)),
        ("unknown string", only(first(json!("a_reason_from_next_year"))), Terminal(R::Other)),
        ("\"LENGTH\" is not \"length\"", only(first(json!("LENGTH"))), Terminal(R::Other)),
        ("a number", only(first(json!(3))), Terminal(R::Other)),
        ("a map without error", only(first(json!({"type": "stop"}))), Terminal(R::Other)),
        ("terminal without any params", only(frame(Some(json!("stop")), None)), Terminal(R::Stop)),
        ("terminal with broken params (never validated)", only(frame(Some(json!("eos")), Some(json!({"ctx_request_id": null})))), Terminal(R::Eos)),
        // Rule 4/5: not finished → decode.
        ("length", only(first(json!("length"))), decode),
        ("null", only(first(Json::Null)), decode),
        ("absent", only(frame(None, Some(trt()))), decode),
        ("not_finished", only(first(json!("not_finished"))), decode),
        ("error: null is no error", only(with(first(json!("length")), "error", Json::Null)), decode),
        // Later frames never change the outcome.
        ("eos followed by an error frame", then(first(json!("eos")), json!({"error": "late"})), Terminal(R::Eos)),
        ("length followed by an error frame", then(first(json!("length")), json!({"error": "late"})), decode),
        ("length followed by an eos frame", then(first(json!("length")), frame(Some(json!("eos")), None)), decode),
        ("eos followed by a length frame", then(frame(Some(json!("eos")), None), first(json!("length"))), Terminal(R::Eos)),
        ("empty first frame followed by a good one", then(json!({}), first(json!("length"))), Error(ErrorCode::NoDisaggregatedParams)),
        // Rule 4: the handoff must be there.
        ("needs decode, params absent", only(frame(Some(json!("length")), None)), Error(ErrorCode::NoDisaggregatedParams)),
        ("needs decode, params null", only(frame(Some(json!("length")), Some(Json::Null))), Error(ErrorCode::NoDisaggregatedParams)),
        ("needs decode, params a string", only(frame(None, Some(json!("ctx_request_id=7")))), Error(ErrorCode::NoDisaggregatedParams)),
        ("needs decode, params an array", only(frame(None, Some(json!([7])))), Error(ErrorCode::NoDisaggregatedParams)),
        ("length first frame with ctx_request_id null", needs_decode(with(trt(), "ctx_request_id", Json::Null)), Error(ErrorCode::MissingCtxRequestId)),
        ("request_type context_only without ctx_request_id", needs_decode(json!({"request_type": "context_only"})), Error(ErrorCode::MissingCtxRequestId)),
        ("SGLang is not asked for ctx_request_id", needs_decode(sglang()), Decode(Backend::Sglang)),
        ("vLLM is not asked for ctx_request_id", needs_decode(vllm()), Decode(Backend::Vllm)),
        ("an opaque map is not asked for ctx_request_id", needs_decode(json!({"kv_handle": "abc"})), Decode(Backend::Opaque)),
        ("an empty params map is opaque", needs_decode(json!({})), Decode(Backend::Opaque)),
    ];
    for (name, message, expect) in rows {
        check(name, &decide_json_as_msgpack(message), expect);
    }
}

#[test]
fn terminal_outputs_keep_the_frame_but_never_the_params() {
    let first = json!({
        "token_ids": [42, 43],
        "text": "Hello",
        "finish_reason": "stop",
        "completion_usage": {"prompt_tokens": 5, "completion_tokens": 2},
        "disaggregated_params": trt(),
        "logprobs": [-0.5, -0.25],
        "a_new_upstream_field": {"nested": [1, "two"]},
    });
    let d = decide_json_as_msgpack(result(json!([first, {"error": "late"}])));
    check("stop", &d, Expect::Terminal(FinishReason::Stop));
    assert_eq!(d.trailing_frames, 1);
    let b = body(&d, Encoding::MsgPack);
    let expected = v(without(first, "disaggregated_params"));
    assert_eq!(field(&b, "output"), Some(&expected));
    // Exactly request_id, kind and output.
    assert!(matches!(&b, Value::Map(m) if m.len() == 3));
    assert!(
        d.headers.is_empty(),
        "MessagePack outputs carry no Content-Type: {:?}",
        d.headers
    );
}

#[test]
fn trailing_frames_are_counted() {
    for (frames, trailing) in [
        (json!([frame(Some(json!("eos")), None)]), 0),
        (json!([frame(Some(json!("eos")), None), {}, {}]), 2),
        (
            json!([frame(Some(json!("length")), Some(trt())), {"error": "x"}]),
            1,
        ),
        (json!([{"error": "x"}, {}, {}, {}]), 3),
    ] {
        let d = decide_json_as_msgpack(result(frames));
        assert_eq!(d.trailing_frames, trailing, "{:?}", d.outcome);
    }
}

#[test]
fn json_in_json_out_with_content_type() {
    let cases = [
        (result(json!([frame(Some(json!("eos")), None)])), "terminal"),
        (
            result(json!([frame(Some(json!("length")), Some(trt()))])),
            "decode",
        ),
        (result(json!([])), "error"),
    ];
    for (message, kind) in cases {
        let bytes = serde_json::to_vec(&message).expect("json");
        let d = decide_bytes(&bytes, Encoding::Json, &rules(), None);
        assert_eq!(d.outcome.kind(), kind);
        assert_eq!(header(&d, "Content-Type"), Some("application/json"));
        let out: Json = serde_json::from_slice(&d.payload).expect("the output is JSON");
        assert_eq!(out["request_id"], "req-1");
    }
}
