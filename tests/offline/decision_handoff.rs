//! Rule 4 of the decision (contract 4.2): the handoff parameters of each
//! engine, one table row per case. The decode job built from valid params is
//! in `decision_job.rs`.

use crate::decision_support;

use decision_support::*;
use prefill_handoff::decision::{Backend, ErrorCode, Outcome};
use prefill_handoff::wire::Encoding;
use rmpv::Value;
use serde_json::{Value as Json, json};

const TWO_63: u64 = 1 << 63;

#[test]
fn tensorrt_llm_params() {
    use Expect::*;
    let ok = Decode(Backend::Trtllm);
    let set = |key: &str, value: Json| with(trt(), key, value);
    let unset = |key: &str| without(trt(), key);
    #[rustfmt::skip]
    let rows: Vec<(&str, Json, Expect)> = vec![
        ("complete", trt(), ok),
        ("only ctx_request_id", json!({"ctx_request_id": 7}), ok),
        ("ctx_request_id 0", set("ctx_request_id", json!(0)), ok),
        ("ctx_request_id 2^63-1", set("ctx_request_id", json!(TWO_63 - 1)), ok),
        ("request_type null", set("request_type", Json::Null), ok),
        ("request_type absent", unset("request_type"), ok),
        // TensorRT-LLM's enum name (`LlmRequestType.CONTEXT_ONLY`) and any case.
        ("request_type CONTEXT_ONLY", set("request_type", json!("CONTEXT_ONLY")), ok),
        ("request_type Context_Only", set("request_type", json!("Context_Only")), ok),
        // trtllm-serve's JSON: opaque_state base64-encoded, the context
        // server's endpoint as a string or a list.
        ("only encoded_opaque_state", json!({"encoded_opaque_state": "AAH/"}), Error(ErrorCode::MissingCtxRequestId)),
        ("encoded_opaque_state", with(unset("opaque_state"), "encoded_opaque_state", json!("AAH/")), ok),
        ("ctx_info_endpoint a string", set("ctx_info_endpoint", json!("tcp://10.0.0.5:8001")), ok),
        ("ctx_info_endpoint a list", set("ctx_info_endpoint", json!(["tcp://10.0.0.5:8001", "tcp://10.0.0.5:8002"])), ok),
        ("disagg_request_id null", set("disagg_request_id", Json::Null), ok),
        ("disagg_request_id 1", set("disagg_request_id", json!(1)), ok),
        ("disagg_request_id 2^63-2", set("disagg_request_id", json!(TWO_63 - 2)), ok),
        // missing_ctx_request_id
        ("ctx_request_id absent", unset("ctx_request_id"), Error(ErrorCode::MissingCtxRequestId)),
        ("ctx_request_id null", set("ctx_request_id", Json::Null), Error(ErrorCode::MissingCtxRequestId)),
        ("only opaque_state", json!({"opaque_state": [1]}), Error(ErrorCode::MissingCtxRequestId)),
        ("only first_gen_tokens", json!({"first_gen_tokens": [1]}), Error(ErrorCode::MissingCtxRequestId)),
        ("only disagg_request_id", json!({"disagg_request_id": 5}), Error(ErrorCode::MissingCtxRequestId)),
        // invalid_ctx_request_id
        ("ctx_request_id float", set("ctx_request_id", json!(7.0)), Error(ErrorCode::InvalidCtxRequestId)),
        ("ctx_request_id negative", set("ctx_request_id", json!(-1)), Error(ErrorCode::InvalidCtxRequestId)),
        ("ctx_request_id 2^63", set("ctx_request_id", json!(TWO_63)), Error(ErrorCode::InvalidCtxRequestId)),
        ("ctx_request_id u64::MAX", set("ctx_request_id", json!(u64::MAX)), Error(ErrorCode::InvalidCtxRequestId)),
        ("ctx_request_id string", set("ctx_request_id", json!("7")), Error(ErrorCode::InvalidCtxRequestId)),
        ("ctx_request_id boolean", set("ctx_request_id", json!(true)), Error(ErrorCode::InvalidCtxRequestId)),
        ("ctx_request_id array", set("ctx_request_id", json!([7])), Error(ErrorCode::InvalidCtxRequestId)),
        // invalid_request_type (checked after ctx_request_id)
        ("request_type generation_only", set("request_type", json!("generation_only")), Error(ErrorCode::InvalidRequestType)),
        ("request_type context_and_generation", set("request_type", json!("context_and_generation")), Error(ErrorCode::InvalidRequestType)),
        ("request_type integer", set("request_type", json!(1)), Error(ErrorCode::InvalidRequestType)),
        ("request_type GENERATION_ONLY", set("request_type", json!("GENERATION_ONLY")), Error(ErrorCode::InvalidRequestType)),
        // invalid_disagg_request_id
        ("disagg_request_id 0", set("disagg_request_id", json!(0)), Error(ErrorCode::InvalidDisaggRequestId)),
        ("disagg_request_id 2^63-1", set("disagg_request_id", json!(TWO_63 - 1)), Error(ErrorCode::InvalidDisaggRequestId)),
        ("disagg_request_id 2^63", set("disagg_request_id", json!(TWO_63)), Error(ErrorCode::InvalidDisaggRequestId)),
        ("disagg_request_id negative", set("disagg_request_id", json!(-5)), Error(ErrorCode::InvalidDisaggRequestId)),
        ("disagg_request_id float", set("disagg_request_id", json!(12.0)), Error(ErrorCode::InvalidDisaggRequestId)),
        ("disagg_request_id string", set("disagg_request_id", json!("12")), Error(ErrorCode::InvalidDisaggRequestId)),
        // Rule order inside the shape.
        ("missing ctx_request_id before a bad request_type", json!({"request_type": "generation_only"}), Error(ErrorCode::MissingCtxRequestId)),
        ("bad request_type before a bad disagg_request_id", json!({"ctx_request_id": 1, "request_type": "x", "disagg_request_id": 0}), Error(ErrorCode::InvalidRequestType)),
        // TensorRT-LLM keys win over other engines' keys.
        ("TensorRT-LLM and SGLang keys", set("bootstrap_host", json!("")), ok),
    ];
    for (name, params, expect) in rows {
        check(name, &decide_json_as_msgpack(needs_decode(params)), expect);
    }
}

#[test]
fn sglang_params() {
    use Expect::*;
    let (ok, bad) = (Decode(Backend::Sglang), Error(ErrorCode::InvalidBootstrap));
    let set = |key: &str, value: Json| with(sglang(), key, value);
    let unset = |key: &str| without(sglang(), key);
    #[rustfmt::skip]
    let rows: Vec<(&str, Json, Expect)> = vec![
        ("complete", sglang(), ok),
        ("port 1", set("bootstrap_port", json!(1)), ok),
        ("port 65535", set("bootstrap_port", json!(65535)), ok),
        ("room 0", set("bootstrap_room", json!(0)), ok),
        ("room 2^63-1", set("bootstrap_room", json!(TWO_63 - 1)), ok),
        ("extra keys kept", set("bootstrap_extra", json!({"a": 1})), ok),
        ("host missing", unset("bootstrap_host"), bad),
        ("host empty", set("bootstrap_host", json!("")), bad),
        ("host null", set("bootstrap_host", Json::Null), bad),
        ("host integer", set("bootstrap_host", json!(10)), bad),
        // SGLang's `bootstrap_port: Optional[...] = None`: the engine's
        // default port.
        ("port missing", unset("bootstrap_port"), ok),
        ("port null", set("bootstrap_port", Json::Null), ok),
        ("port 0", set("bootstrap_port", json!(0)), bad),
        ("port 65536", set("bootstrap_port", json!(65536)), bad),
        ("port negative", set("bootstrap_port", json!(-80)), bad),
        ("port string", set("bootstrap_port", json!("8998")), bad),
        ("port float", set("bootstrap_port", json!(8998.0)), bad),
        ("room missing", unset("bootstrap_room"), bad),
        ("room negative", set("bootstrap_room", json!(-1)), bad),
        ("room 2^63", set("bootstrap_room", json!(TWO_63)), bad),
        ("room float", set("bootstrap_room", json!(1.5)), bad),
        ("only an unknown bootstrap_ key", json!({"bootstrap_x": 1}), bad),
        // SGLang keys win over vLLM keys.
        ("SGLang and vLLM keys", with(vllm(), "bootstrap_host", json!("h")), bad),
    ];
    for (name, params, expect) in rows {
        check(name, &decide_json_as_msgpack(needs_decode(params)), expect);
    }
}

#[test]
fn vllm_params() {
    use Expect::*;
    let (ok, bad) = (
        Decode(Backend::Vllm),
        Error(ErrorCode::InvalidKvTransferParams),
    );
    let set = |key: &str, value: Json| with(vllm(), key, value);
    let unset = |key: &str| without(vllm(), key);
    #[rustfmt::skip]
    let rows: Vec<(&str, Json, Expect)> = vec![
        ("complete", vllm(), ok),
        ("no remote_port", unset("remote_port"), ok),
        ("remote_port null", set("remote_port", Json::Null), ok),
        ("empty block list", set("remote_block_ids", json!([])), ok),
        ("only do_remote_prefill", json!({"do_remote_prefill": true}), bad),
        ("engine id missing", unset("remote_engine_id"), bad),
        ("engine id empty", set("remote_engine_id", json!("")), bad),
        ("engine id integer", set("remote_engine_id", json!(3)), bad),
        ("block ids missing", unset("remote_block_ids"), bad),
        ("block ids a map", set("remote_block_ids", json!({"0": 1})), bad),
        ("block ids negative", set("remote_block_ids", json!([1, -1])), bad),
        ("block ids float", set("remote_block_ids", json!([1, 2.0])), bad),
        ("block ids string", set("remote_block_ids", json!(["1"])), bad),
        ("remote_port 0", set("remote_port", json!(0)), bad),
        ("remote_port 65536", set("remote_port", json!(65536)), bad),
        ("remote_port string", set("remote_port", json!("5600")), bad),
        // One list of block IDs per KV-cache group (vLLM's `BlockIds`).
        ("grouped block ids", set("remote_block_ids", json!([[0, 1, 2], [7, 8]])), ok),
        ("one group", set("remote_block_ids", json!([[0, 1, 2]])), ok),
        ("empty groups", set("remote_block_ids", json!([[], []])), ok),
        ("groups and ids mixed", set("remote_block_ids", json!([[0, 1], 2])), bad),
        ("a negative id in a group", set("remote_block_ids", json!([[0], [-1]])), bad),
        ("groups of groups", set("remote_block_ids", json!([[[0]]])), bad),
        // Dynamo's vLLM handlers nest the params.
        ("nested", json!({"kv_transfer_params": vllm()}), ok),
        ("nested, grouped", json!({"kv_transfer_params": with(vllm(), "remote_block_ids", json!([[1], [2]]))}), ok),
        ("nested, with other keys beside", json!({"kv_transfer_params": vllm(), "worker_id": 3}), ok),
        ("nested without an engine id", json!({"kv_transfer_params": without(vllm(), "remote_engine_id")}), bad),
        ("nested null", json!({"kv_transfer_params": null}), bad),
        ("nested a list", json!({"kv_transfer_params": [vllm()]}), bad),
        // Top-level vLLM keys win over the nested map.
        ("top-level keys and a nested map", with(vllm(), "kv_transfer_params", json!({})), ok),
    ];
    for (name, params, expect) in rows {
        check(name, &decide_json_as_msgpack(needs_decode(params)), expect);
    }
}

/// MessagePack bytes of a result whose params are `{"ctx_request_id": <raw>}`
/// with the integer written in exactly the encoding given, plus
/// `"disagg_request_id": <raw>` when `disagg` is set.
fn with_raw_int(ctx: &[u8], disagg: Option<&[u8]>) -> Vec<u8> {
    fn s(out: &mut Vec<u8>, text: &str) {
        out.push(0xa0 | text.len() as u8); // fixstr
        out.extend_from_slice(text.as_bytes());
    }
    let mut out = vec![0x83]; // fixmap, 3 entries
    s(&mut out, "request_id");
    s(&mut out, "req-1");
    s(&mut out, "reply_to");
    s(&mut out, REPLY);
    s(&mut out, "frames");
    out.push(0x91); // fixarray, 1 frame
    out.push(0x82); // fixmap: finish_reason, disaggregated_params
    s(&mut out, "finish_reason");
    s(&mut out, "length");
    s(&mut out, "disaggregated_params");
    out.push(if disagg.is_some() { 0x82 } else { 0x81 });
    s(&mut out, "ctx_request_id");
    out.extend_from_slice(ctx);
    if let Some(d) = disagg {
        s(&mut out, "disagg_request_id");
        out.extend_from_slice(d);
    }
    out
}

#[test]
fn integers_in_every_messagepack_encoding_are_accepted() {
    // 7 in every integer encoding MessagePack has.
    let sevens: [(&str, &[u8]); 9] = [
        ("positive fixint", &[0x07]),
        ("uint 8", &[0xcc, 7]),
        ("uint 16", &[0xcd, 0, 7]),
        ("uint 32", &[0xce, 0, 0, 0, 7]),
        ("uint 64", &[0xcf, 0, 0, 0, 0, 0, 0, 0, 7]),
        ("int 8", &[0xd0, 7]),
        ("int 16", &[0xd1, 0, 7]),
        ("int 32", &[0xd2, 0, 0, 0, 7]),
        ("int 64", &[0xd3, 0, 0, 0, 0, 0, 0, 0, 7]),
    ];
    for (name, seven) in sevens {
        let d = decide_bytes(
            &with_raw_int(seven, Some(seven)),
            Encoding::MsgPack,
            &rules(),
            None,
        );
        check(name, &d, Expect::Decode(Backend::Trtllm));
        let b = body(&d, Encoding::MsgPack);
        assert_eq!(
            path(&b, &["handoff", "ctx_request_id"]),
            Some(&Value::from(7)),
            "{name}"
        );
        assert_eq!(
            field(&b, "disagg_request_id"),
            Some(&Value::from(7)),
            "{name}"
        );
        assert_eq!(
            d.outcome,
            Outcome::Decode {
                backend: Backend::Trtllm,
                minted: false
            }
        );
    }
    // Negative, too large, and floats where an integer is required.
    let refused: [(&str, &[u8]); 7] = [
        ("negative fixint", &[0xff]),
        ("int 8 -1", &[0xd0, 0xff]),
        ("int 64 min", &[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0]),
        ("uint 64 2^63", &[0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0]),
        ("float 32 7.0", &[0xca, 0x40, 0xe0, 0, 0]),
        ("float 64 7.0", &[0xcb, 0x40, 0x1c, 0, 0, 0, 0, 0, 0]),
        ("nil is missing, not invalid", &[0xc0]),
    ];
    for (name, bad) in refused {
        let d = decide_bytes(&with_raw_int(bad, None), Encoding::MsgPack, &rules(), None);
        let code = if bad == [0xc0] {
            ErrorCode::MissingCtxRequestId
        } else {
            ErrorCode::InvalidCtxRequestId
        };
        check(name, &d, Expect::Error(code));
    }
    // And the largest valid value in the widest encodings.
    for largest in [
        &[0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],
        &[0xd3, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],
    ] {
        let d = decide_bytes(
            &with_raw_int(largest, None),
            Encoding::MsgPack,
            &rules(),
            None,
        );
        check("2^63-1", &d, Expect::Decode(Backend::Trtllm));
    }
}
