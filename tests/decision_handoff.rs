//! Rule 4 of the decision (contract 4.2): the handoff parameters of each
//! engine, and the decode job built from them (contract 4.3).

mod decision_support;

use decision_support::*;
use prefill_handoff::decision::{Backend, ErrorCode, IdSource, Input, Outcome, decide};
use prefill_handoff::identity::Identity;
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout, MachineId};
use prefill_handoff::wire::Encoding;
use rmpv::Value;
use serde_json::{Value as Json, json};

const TWO_63: u64 = 1 << 63;

#[test]
fn tensorrt_llm_params() {
    use Expect::*;
    let rows: Vec<(&str, Json, Expect)> = vec![
        ("complete", trt(), Decode(Backend::Trtllm)),
        (
            "only ctx_request_id",
            json!({"ctx_request_id": 7}),
            Decode(Backend::Trtllm),
        ),
        (
            "ctx_request_id 0",
            with(trt(), "ctx_request_id", json!(0)),
            Decode(Backend::Trtllm),
        ),
        (
            "ctx_request_id 2^63-1",
            with(trt(), "ctx_request_id", json!(TWO_63 - 1)),
            Decode(Backend::Trtllm),
        ),
        (
            "request_type null",
            with(trt(), "request_type", Json::Null),
            Decode(Backend::Trtllm),
        ),
        (
            "request_type absent",
            without(trt(), "request_type"),
            Decode(Backend::Trtllm),
        ),
        (
            "disagg_request_id null",
            with(trt(), "disagg_request_id", Json::Null),
            Decode(Backend::Trtllm),
        ),
        (
            "disagg_request_id 1",
            with(trt(), "disagg_request_id", json!(1)),
            Decode(Backend::Trtllm),
        ),
        (
            "disagg_request_id 2^63-2",
            with(trt(), "disagg_request_id", json!(TWO_63 - 2)),
            Decode(Backend::Trtllm),
        ),
        // missing_ctx_request_id
        (
            "ctx_request_id absent",
            without(trt(), "ctx_request_id"),
            Error(ErrorCode::MissingCtxRequestId),
        ),
        (
            "ctx_request_id null",
            with(trt(), "ctx_request_id", Json::Null),
            Error(ErrorCode::MissingCtxRequestId),
        ),
        (
            "only opaque_state",
            json!({"opaque_state": [1]}),
            Error(ErrorCode::MissingCtxRequestId),
        ),
        (
            "only first_gen_tokens",
            json!({"first_gen_tokens": [1]}),
            Error(ErrorCode::MissingCtxRequestId),
        ),
        (
            "only disagg_request_id",
            json!({"disagg_request_id": 5}),
            Error(ErrorCode::MissingCtxRequestId),
        ),
        // invalid_ctx_request_id
        (
            "ctx_request_id float",
            with(trt(), "ctx_request_id", json!(7.0)),
            Error(ErrorCode::InvalidCtxRequestId),
        ),
        (
            "ctx_request_id negative",
            with(trt(), "ctx_request_id", json!(-1)),
            Error(ErrorCode::InvalidCtxRequestId),
        ),
        (
            "ctx_request_id 2^63",
            with(trt(), "ctx_request_id", json!(TWO_63)),
            Error(ErrorCode::InvalidCtxRequestId),
        ),
        (
            "ctx_request_id u64::MAX",
            with(trt(), "ctx_request_id", json!(u64::MAX)),
            Error(ErrorCode::InvalidCtxRequestId),
        ),
        (
            "ctx_request_id string",
            with(trt(), "ctx_request_id", json!("7")),
            Error(ErrorCode::InvalidCtxRequestId),
        ),
        (
            "ctx_request_id boolean",
            with(trt(), "ctx_request_id", json!(true)),
            Error(ErrorCode::InvalidCtxRequestId),
        ),
        (
            "ctx_request_id array",
            with(trt(), "ctx_request_id", json!([7])),
            Error(ErrorCode::InvalidCtxRequestId),
        ),
        // invalid_request_type (checked after ctx_request_id)
        (
            "request_type generation_only",
            with(trt(), "request_type", json!("generation_only")),
            Error(ErrorCode::InvalidRequestType),
        ),
        (
            "request_type context_and_generation",
            with(trt(), "request_type", json!("context_and_generation")),
            Error(ErrorCode::InvalidRequestType),
        ),
        (
            "request_type integer",
            with(trt(), "request_type", json!(1)),
            Error(ErrorCode::InvalidRequestType),
        ),
        (
            "request_type wrong case",
            with(trt(), "request_type", json!("CONTEXT_ONLY")),
            Error(ErrorCode::InvalidRequestType),
        ),
        // invalid_disagg_request_id
        (
            "disagg_request_id 0",
            with(trt(), "disagg_request_id", json!(0)),
            Error(ErrorCode::InvalidDisaggRequestId),
        ),
        (
            "disagg_request_id 2^63-1",
            with(trt(), "disagg_request_id", json!(TWO_63 - 1)),
            Error(ErrorCode::InvalidDisaggRequestId),
        ),
        (
            "disagg_request_id 2^63",
            with(trt(), "disagg_request_id", json!(TWO_63)),
            Error(ErrorCode::InvalidDisaggRequestId),
        ),
        (
            "disagg_request_id negative",
            with(trt(), "disagg_request_id", json!(-5)),
            Error(ErrorCode::InvalidDisaggRequestId),
        ),
        (
            "disagg_request_id float",
            with(trt(), "disagg_request_id", json!(12.0)),
            Error(ErrorCode::InvalidDisaggRequestId),
        ),
        (
            "disagg_request_id string",
            with(trt(), "disagg_request_id", json!("12")),
            Error(ErrorCode::InvalidDisaggRequestId),
        ),
        // Rule order inside the shape.
        (
            "missing ctx_request_id before a bad request_type",
            json!({"request_type": "generation_only"}),
            Error(ErrorCode::MissingCtxRequestId),
        ),
        (
            "bad request_type before a bad disagg_request_id",
            json!({"ctx_request_id": 1, "request_type": "x", "disagg_request_id": 0}),
            Error(ErrorCode::InvalidRequestType),
        ),
        // TensorRT-LLM keys win over other engines' keys.
        (
            "TensorRT-LLM and SGLang keys",
            with(trt(), "bootstrap_host", json!("")),
            Decode(Backend::Trtllm),
        ),
    ];
    for (name, params, expect) in rows {
        check(name, &decide_json_as_msgpack(needs_decode(params)), expect);
    }
}

#[test]
fn sglang_params() {
    use Expect::*;
    let bad = Error(ErrorCode::InvalidBootstrap);
    let rows: Vec<(&str, Json, Expect)> = vec![
        ("complete", sglang(), Decode(Backend::Sglang)),
        (
            "port 1",
            with(sglang(), "bootstrap_port", json!(1)),
            Decode(Backend::Sglang),
        ),
        (
            "port 65535",
            with(sglang(), "bootstrap_port", json!(65535)),
            Decode(Backend::Sglang),
        ),
        (
            "room 0",
            with(sglang(), "bootstrap_room", json!(0)),
            Decode(Backend::Sglang),
        ),
        (
            "room 2^63-1",
            with(sglang(), "bootstrap_room", json!(TWO_63 - 1)),
            Decode(Backend::Sglang),
        ),
        (
            "extra keys kept",
            with(sglang(), "bootstrap_extra", json!({"a": 1})),
            Decode(Backend::Sglang),
        ),
        ("host missing", without(sglang(), "bootstrap_host"), bad),
        (
            "host empty",
            with(sglang(), "bootstrap_host", json!("")),
            bad,
        ),
        (
            "host null",
            with(sglang(), "bootstrap_host", Json::Null),
            bad,
        ),
        (
            "host integer",
            with(sglang(), "bootstrap_host", json!(10)),
            bad,
        ),
        ("port missing", without(sglang(), "bootstrap_port"), bad),
        ("port 0", with(sglang(), "bootstrap_port", json!(0)), bad),
        (
            "port 65536",
            with(sglang(), "bootstrap_port", json!(65536)),
            bad,
        ),
        (
            "port negative",
            with(sglang(), "bootstrap_port", json!(-80)),
            bad,
        ),
        (
            "port string",
            with(sglang(), "bootstrap_port", json!("8998")),
            bad,
        ),
        (
            "port float",
            with(sglang(), "bootstrap_port", json!(8998.0)),
            bad,
        ),
        ("room missing", without(sglang(), "bootstrap_room"), bad),
        (
            "room negative",
            with(sglang(), "bootstrap_room", json!(-1)),
            bad,
        ),
        (
            "room 2^63",
            with(sglang(), "bootstrap_room", json!(TWO_63)),
            bad,
        ),
        (
            "room float",
            with(sglang(), "bootstrap_room", json!(1.5)),
            bad,
        ),
        (
            "only an unknown bootstrap_ key",
            json!({"bootstrap_x": 1}),
            bad,
        ),
        // SGLang keys win over vLLM keys.
        (
            "SGLang and vLLM keys",
            with(vllm(), "bootstrap_host", json!("h")),
            bad,
        ),
    ];
    for (name, params, expect) in rows {
        check(name, &decide_json_as_msgpack(needs_decode(params)), expect);
    }
}

#[test]
fn vllm_params() {
    use Expect::*;
    let bad = Error(ErrorCode::InvalidKvTransferParams);
    let rows: Vec<(&str, Json, Expect)> = vec![
        ("complete", vllm(), Decode(Backend::Vllm)),
        (
            "no remote_port",
            without(vllm(), "remote_port"),
            Decode(Backend::Vllm),
        ),
        (
            "remote_port null",
            with(vllm(), "remote_port", Json::Null),
            Decode(Backend::Vllm),
        ),
        (
            "empty block list",
            with(vllm(), "remote_block_ids", json!([])),
            Decode(Backend::Vllm),
        ),
        (
            "only do_remote_prefill",
            json!({"do_remote_prefill": true}),
            bad,
        ),
        (
            "engine id missing",
            without(vllm(), "remote_engine_id"),
            bad,
        ),
        (
            "engine id empty",
            with(vllm(), "remote_engine_id", json!("")),
            bad,
        ),
        (
            "engine id integer",
            with(vllm(), "remote_engine_id", json!(3)),
            bad,
        ),
        (
            "block ids missing",
            without(vllm(), "remote_block_ids"),
            bad,
        ),
        (
            "block ids a map",
            with(vllm(), "remote_block_ids", json!({"0": 1})),
            bad,
        ),
        (
            "block ids negative",
            with(vllm(), "remote_block_ids", json!([1, -1])),
            bad,
        ),
        (
            "block ids float",
            with(vllm(), "remote_block_ids", json!([1, 2.0])),
            bad,
        ),
        (
            "block ids string",
            with(vllm(), "remote_block_ids", json!(["1"])),
            bad,
        ),
        ("remote_port 0", with(vllm(), "remote_port", json!(0)), bad),
        (
            "remote_port 65536",
            with(vllm(), "remote_port", json!(65536)),
            bad,
        ),
        (
            "remote_port string",
            with(vllm(), "remote_port", json!("5600")),
            bad,
        ),
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

#[test]
fn the_decode_job_carries_what_contract_4_3_lists() {
    let params = with(trt(), "engine_extra", json!({"layers": [1, 2]}));
    let first = frame(Some(json!("length")), Some(params.clone()));
    let request = json!({"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64});
    let message = with(result(json!([first.clone()])), "request", request.clone());
    let d = decide_json_as_msgpack(message);
    assert_eq!(
        d.outcome,
        Outcome::Decode {
            backend: Backend::Trtllm,
            minted: true
        }
    );
    assert_eq!(d.subject, GEN);
    assert_eq!(d.request_id.as_deref(), Some("req-1"));
    assert_eq!(header(&d, "Nats-Msg-Id"), Some("handoff-req-1"));
    assert_eq!(header(&d, "Content-Type"), None);

    let input_keys: Vec<String> = match v(params.clone()) {
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, _)| k.as_str().map(str::to_string))
            .collect(),
        _ => unreachable!(),
    };
    let mut handoff = params;
    handoff["request_type"] = json!("generation_only");
    handoff["disagg_request_id"] = json!(FIRST_MINTED);
    let expected = json!({
        "request_id": "req-1",
        "reply_to": REPLY,
        "backend": "trtllm",
        "disagg_request_id": FIRST_MINTED,
        "handoff": handoff,
        "prefill_output": without(first, "disaggregated_params"),
        "request": request,
        "worker": {"instance_id": "00000000000000ab", "machine_id": 17},
    });
    let got = prefill_handoff::wire::to_json(&body(&d, Encoding::MsgPack));
    assert_eq!(got, expected);
    // Key order of the params is kept; the rewritten request_type stays in
    // place and the minted disagg_request_id comes last.
    let b = body(&d, Encoding::MsgPack);
    let keys: Vec<&str> = match field(&b, "handoff") {
        Some(Value::Map(m)) => m.iter().filter_map(|(k, _)| k.as_str()).collect(),
        other => panic!("handoff is {other:?}"),
    };
    let mut expected_keys: Vec<&str> = input_keys.iter().map(String::as_str).collect();
    expected_keys.push("disagg_request_id");
    assert_eq!(keys, expected_keys);
}

#[test]
fn disagg_request_id_is_kept_when_valid_and_minted_when_absent() {
    let cases = [
        (
            with(trt(), "disagg_request_id", json!(123_456)),
            123_456,
            false,
        ),
        (
            with(trt(), "disagg_request_id", Json::Null),
            FIRST_MINTED,
            true,
        ),
        (trt(), FIRST_MINTED, true),
    ];
    for (params, id, minted) in cases {
        let mut ids = TestIds::holding_slot();
        let bytes = msgpack(&v(needs_decode(params)));
        let input = Input {
            payload: &bytes,
            encoding: Encoding::MsgPack,
            subject: SOURCE,
            nats_reply: None,
        };
        let d = decide(input, &rules(), &mut ids);
        assert_eq!(
            d.outcome,
            Outcome::Decode {
                backend: Backend::Trtllm,
                minted
            }
        );
        assert_eq!(ids.minted, usize::from(minted), "mint only when needed");
        let b = body(&d, Encoding::MsgPack);
        assert_eq!(field(&b, "disagg_request_id"), Some(&Value::from(id)));
        assert_eq!(
            path(&b, &["handoff", "disagg_request_id"]),
            Some(&Value::from(id))
        );
    }
    // Other backends get no disagg_request_id and mint nothing.
    for params in [sglang(), vllm(), json!({"x": 1})] {
        let mut ids = TestIds::holding_slot();
        let bytes = msgpack(&v(needs_decode(params)));
        let input = Input {
            payload: &bytes,
            encoding: Encoding::MsgPack,
            subject: SOURCE,
            nats_reply: None,
        };
        let d = decide(input, &rules(), &mut ids);
        assert_eq!(ids.minted, 0);
        let b = body(&d, Encoding::MsgPack);
        assert_eq!(field(&b, "disagg_request_id"), None);
        assert_eq!(field(&b, "request"), None, "no request in, no request out");
    }
}

fn decide_with(ids: &mut dyn IdSource, params: Json) -> prefill_handoff::decision::Decision {
    let bytes = msgpack(&v(needs_decode(params)));
    let input = Input {
        payload: &bytes,
        encoding: Encoding::MsgPack,
        subject: SOURCE,
        nats_reply: None,
    };
    decide(input, &rules(), ids)
}

#[test]
fn a_fenced_identity_refuses_to_mint_but_lets_other_results_through() {
    let mut fenced = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    check(
        "mint needed while fenced",
        &decide_with(&mut fenced, trt()),
        Expect::Error(ErrorCode::IdentityUnavailable),
    );
    // No mint needed: decode, with machine_id null because no slot is held.
    for (params, backend) in [
        (with(trt(), "disagg_request_id", json!(99)), Backend::Trtllm),
        (sglang(), Backend::Sglang),
        (vllm(), Backend::Vllm),
        (json!({"handle": 1}), Backend::Opaque),
    ] {
        let d = decide_with(&mut fenced, params);
        check("no mint needed", &d, Expect::Decode(backend));
        let b = body(&d, Encoding::MsgPack);
        assert_eq!(path(&b, &["worker", "machine_id"]), Some(&Value::Nil));
        assert_eq!(
            path(&b, &["worker", "instance_id"]).and_then(Value::as_str),
            Some("0000000000000000")
        );
    }
    // Terminal answers never need the identity.
    let bytes = msgpack(&v(result(json!([frame(Some(json!("eos")), Some(trt()))]))));
    let input = Input {
        payload: &bytes,
        encoding: Encoding::MsgPack,
        subject: SOURCE,
        nats_reply: None,
    };
    assert_eq!(
        decide(input, &rules(), &mut fenced).outcome.kind(),
        "terminal"
    );
}

#[test]
fn a_real_identity_mints_ids_of_its_slot_and_layout() {
    for layout in [IdLayout::Rc21, IdLayout::Rc22] {
        let slot = MachineId::new(1020).expect("slot");
        let mut identity = Identity::fixed(layout, DEFAULT_EPOCH_UNIX_MS, slot);
        let mut last = 0;
        for _ in 0..3 {
            let d = decide_with(&mut identity, trt());
            let b = body(&d, Encoding::MsgPack);
            let id = field(&b, "disagg_request_id")
                .and_then(Value::as_u64)
                .expect("minted");
            assert!(id > last, "IDs from one slot increase");
            last = id;
            assert_eq!(layout.decode(id).map(|x| x.machine_id), Ok(1020));
            assert_eq!(
                path(&b, &["worker", "machine_id"]),
                Some(&Value::from(1020))
            );
        }
    }
}

#[test]
fn nats_msg_id_is_handoff_dash_request_id_and_cannot_inject_a_header() {
    let cases = [
        ("req-1", "handoff-req-1"),
        ("chatcmpl-9f8e7d6c5b4a", "handoff-chatcmpl-9f8e7d6c5b4a"),
        ("with space", "handoff-with space"),
        ("a%b", "handoff-a%25b"),
        ("a\r\nNats-Msg-Id: x", "handoff-a%0D%0ANats-Msg-Id: x"),
        ("é", "handoff-%C3%A9"),
    ];
    for (request_id, msg_id) in cases {
        assert_eq!(prefill_handoff::decision::msg_id(request_id), msg_id);
        let message = with(needs_decode(sglang()), "request_id", json!(request_id));
        let d = decide_json_as_msgpack(message);
        assert_eq!(header(&d, "Nats-Msg-Id"), Some(msg_id));
    }
}
