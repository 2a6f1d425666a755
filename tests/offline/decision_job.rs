//! The decode job (contract 4.3): its fields, the kept or minted
//! `disagg_request_id`, the worker block, and `Nats-Msg-Id`.

use crate::decision_support;

use decision_support::*;
use prefill_handoff::decision::{Backend, ErrorCode, IdSource, Outcome, decide};
use prefill_handoff::identity::Identity;
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout, MachineId};
use prefill_handoff::wire::Encoding;
use rmpv::Value;
use serde_json::{Value as Json, json};

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
    assert_eq!(&*d.subject, GEN);
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
        let input = input(&bytes, Encoding::MsgPack);
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
        let input = input(&bytes, Encoding::MsgPack);
        let d = decide(input, &rules(), &mut ids);
        assert_eq!(ids.minted, 0);
        let b = body(&d, Encoding::MsgPack);
        assert_eq!(field(&b, "disagg_request_id"), None);
        assert_eq!(field(&b, "request"), None, "no request in, no request out");
    }
}

fn decide_with(ids: &mut dyn IdSource, params: Json) -> prefill_handoff::decision::Decision {
    let bytes = msgpack(&v(needs_decode(params)));
    let input = input(&bytes, Encoding::MsgPack);
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
    let input = input(&bytes, Encoding::MsgPack);
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
        ("with space", "handoff-with%20space"),
        ("trailing ", "handoff-trailing%20"),
        ("a%b", "handoff-a%25b"),
        ("a\r\nNats-Msg-Id: x", "handoff-a%0D%0ANats-Msg-Id:%20x"),
        ("é", "handoff-%C3%A9"),
    ];
    for (request_id, msg_id) in cases {
        assert_eq!(prefill_handoff::headers::msg_id(request_id), msg_id);
        let message = with(needs_decode(sglang()), "request_id", json!(request_id));
        let d = decide_json_as_msgpack(message);
        assert_eq!(header(&d, "Nats-Msg-Id"), Some(msg_id));
    }
}
