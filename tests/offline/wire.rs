//! Wire encodings (contract 3): unknown fields, MessagePack binary and ext
//! values, non-string keys and invalid UTF-8 pass through into the decode job
//! unchanged; JSON in gives JSON out; the MessagePack reader refuses what is
//! not exactly one well-formed value.

use crate::decision_support;

use decision_support::*;
use prefill_handoff::decision::{Backend, FinishReason, Outcome};
use prefill_handoff::wire::{self, Encoding, MAX_DEPTH, WireError, map};
use proptest::prelude::*;
use rmpv::Value;
use serde_json::{Value as Json, json};

fn k(s: &str) -> Value {
    Value::from(s)
}

/// A string value whose bytes are not UTF-8 (only a decoder can build one).
fn invalid_utf8(bytes: &[u8]) -> Value {
    let mut raw = vec![0xdb];
    raw.extend((bytes.len() as u32).to_be_bytes());
    raw.extend_from_slice(bytes);
    let value = rmpv::decode::read_value(&mut &raw[..]).expect("a str32");
    assert!(
        matches!(&value, Value::String(s) if !s.is_str()) || std::str::from_utf8(bytes).is_ok()
    );
    value
}

/// A value that exercises everything JSON cannot say.
fn oddities() -> Value {
    Value::Map(vec![
        (k("bin"), Value::Binary((0..=255).collect())),
        (k("ext"), Value::Ext(42, vec![1, 2, 3, 4])),
        (Value::from(7), k("an integer key")),
        (Value::Binary(vec![0xff, 0x00]), k("a binary key")),
        (k("latin1"), invalid_utf8(b"caf\xe9")),
        (k("f32"), Value::F32(1.5)),
        (k("neg"), Value::from(-3)),
        (k("big"), Value::from(u64::MAX)),
        (
            k("nested"),
            Value::Array(vec![Value::Nil, Value::Boolean(false), Value::Map(vec![])]),
        ),
    ])
}

fn trt_params_with_oddities() -> Vec<(Value, Value)> {
    vec![
        (k("ctx_request_id"), Value::from(7)),
        (k("request_type"), k("context_only")),
        (k("opaque_state"), Value::Binary(vec![0xab; 256])),
        (k("first_gen_tokens"), Value::Array(vec![Value::from(42)])),
        (k("unknown_engine_field"), oddities()),
    ]
}

fn first_frame_with_oddities() -> Vec<(Value, Value)> {
    vec![
        (k("token_ids"), Value::Array(vec![Value::from(42)])),
        (k("finish_reason"), k("length")),
        (k("frame_extra"), oddities()),
        (
            k("disaggregated_params"),
            Value::Map(trt_params_with_oddities()),
        ),
    ]
}

fn message_with_oddities() -> Value {
    Value::Map(vec![
        (k("request_id"), k("req-1")),
        (k("reply_to"), k(REPLY)),
        (
            k("frames"),
            Value::Array(vec![Value::Map(first_frame_with_oddities()), oddities()]),
        ),
        (k("request"), oddities()),
        (k("top_extra"), oddities()),
        (Value::from(99), k("top-level integer key")),
    ])
}

#[test]
fn unknown_fields_and_messagepack_oddities_flow_into_the_decode_job() {
    let input = msgpack(&message_with_oddities());
    let d = decide_bytes(&input, Encoding::MsgPack, &rules(), None);
    assert_eq!(
        d.outcome,
        Outcome::Decode {
            backend: Backend::Trtllm,
            minted: true
        }
    );
    let job = body(&d, Encoding::MsgPack);

    let mut handoff = trt_params_with_oddities();
    map::set(&mut handoff, "request_type", k("generation_only"));
    map::set(&mut handoff, "disagg_request_id", Value::from(FIRST_MINTED));
    assert_eq!(field(&job, "handoff"), Some(&Value::Map(handoff)));

    let mut output = first_frame_with_oddities();
    map::remove(&mut output, "disaggregated_params");
    assert_eq!(field(&job, "prefill_output"), Some(&Value::Map(output)));
    assert_eq!(field(&job, "request"), Some(&oddities()));
    assert_eq!(field(&job, "top_extra"), Some(&oddities()));
    let Value::Map(entries) = &job else {
        panic!("the job is a map")
    };
    assert!(entries.contains(&(Value::from(99), k("top-level integer key"))));
    // Known input keys are not repeated: frames are not passed on, and each
    // key appears once.
    assert_eq!(field(&job, "frames"), None);
    assert_eq!(map::duplicate_key(entries), None);

    // Byte for byte: the binary opaque_state and the Latin-1 string.
    let find = |needle: &[u8]| d.payload.windows(needle.len()).any(|w| w == needle);
    assert!(
        find(&[&[0xc5, 0x01, 0x00][..], &[0xab; 256][..]].concat()),
        "the 256-byte binary opaque_state, as it came"
    );
    assert!(find(b"\xa4caf\xe9"), "the invalid UTF-8 string, as it came");
    assert!(find(&[0xd6, 42, 1, 2, 3, 4]), "the ext value, as it came");
}

#[test]
fn terminal_outputs_keep_messagepack_oddities() {
    let mut first = first_frame_with_oddities();
    map::set(&mut first, "finish_reason", k("stop"));
    let message = Value::Map(vec![
        (k("request_id"), k("req-1")),
        (k("reply_to"), k(REPLY)),
        (k("frames"), Value::Array(vec![Value::Map(first.clone())])),
    ]);
    let d = decide_msgpack(&message);
    assert_eq!(
        d.outcome,
        Outcome::Terminal {
            finish_reason: FinishReason::Stop
        }
    );
    map::remove(&mut first, "disaggregated_params");
    assert_eq!(
        field(&body(&d, Encoding::MsgPack), "output"),
        Some(&Value::Map(first))
    );
}

#[test]
fn input_fields_under_the_jobs_own_names_do_not_override_them() {
    let message = with(
        with(
            with(needs_decode(sglang()), "backend", json!("evil")),
            "worker",
            json!({"machine_id": 5}),
        ),
        "disagg_request_id",
        json!(5),
    );
    let d = decide_json_as_msgpack(message);
    let job = body(&d, Encoding::MsgPack);
    assert_eq!(
        field(&job, "backend").and_then(Value::as_str),
        Some("sglang")
    );
    assert_eq!(
        path(&job, &["worker", "machine_id"]),
        Some(&Value::from(17))
    );
    assert_eq!(field(&job, "disagg_request_id"), None);
    let Value::Map(entries) = &job else {
        panic!("a map")
    };
    assert_eq!(map::duplicate_key(entries), None);
}

#[test]
fn json_in_gives_json_out_with_every_field_kept() {
    let params = with(
        trt(),
        "extra",
        json!({"unicode": "naïve ✓", "list": [1.5, -2, null]}),
    );
    let first = with(
        frame(Some(json!("length")), Some(params.clone())),
        "logprobs",
        json!([-0.1]),
    );
    let request = json!({"model": "m", "big": u64::MAX, "neg": i64::MIN, "ratio": 0.1 + 0.2});
    let message = with(
        with(
            result(json!([first.clone(), {"error": "x"}])),
            "request",
            request.clone(),
        ),
        "top_extra",
        json!({"a": [true, false]}),
    );
    let input = serde_json::to_vec(&message).expect("json");
    let d = decide_bytes(&input, Encoding::Json, &rules(), None);
    assert_eq!(header(&d, "Content-Type"), Some("application/json"));
    assert_eq!(header(&d, "Nats-Msg-Id"), Some("handoff-req-1"));
    let job: Json = serde_json::from_slice(&d.payload).expect("the job is JSON");
    let mut handoff = params;
    handoff["request_type"] = json!("generation_only");
    handoff["disagg_request_id"] = json!(FIRST_MINTED);
    assert_eq!(job["handoff"], handoff);
    assert_eq!(
        job["prefill_output"],
        without(first, "disaggregated_params")
    );
    assert_eq!(job["request"], request);
    assert_eq!(job["top_extra"], json!({"a": [true, false]}));
    assert_eq!(job["disagg_request_id"], json!(FIRST_MINTED));
}

#[test]
fn content_type_selects_the_encoding() {
    let cases = [
        (None, Encoding::MsgPack),
        (Some("application/json"), Encoding::Json),
        (Some("application/json; charset=utf-8"), Encoding::Json),
        (Some("Application/JSON"), Encoding::Json),
        (Some(" application/json "), Encoding::Json),
        (Some("application/msgpack"), Encoding::MsgPack),
        (Some("text/plain"), Encoding::MsgPack),
        (Some(""), Encoding::MsgPack),
    ];
    for (header, encoding) in cases {
        assert_eq!(Encoding::from_content_type(header), encoding, "{header:?}");
    }
    assert_eq!(Encoding::Json.content_type(), Some("application/json"));
    assert_eq!(Encoding::MsgPack.content_type(), None);
}

#[test]
fn the_messagepack_reader_refuses_what_is_not_one_well_formed_value() {
    let good = msgpack(&message_with_oddities());
    assert!(wire::decode(&good, Encoding::MsgPack).is_ok());
    // Every strict prefix is truncated.
    for cut in 0..good.len() {
        assert!(
            wire::decode(&good[..cut], Encoding::MsgPack).is_err(),
            "prefix of {cut} bytes"
        );
    }
    let cases: [(&str, &[u8]); 8] = [
        ("reserved marker", &[0xc1]),
        ("reserved marker as a value", &[0x81, 0xa1, b'a', 0xc1]),
        ("trailing byte", &[0xc0, 0xc0]),
        (
            "array claims more items than bytes",
            &[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01],
        ),
        ("map claims 2^32-1 entries", &[0xdf, 0xff, 0xff, 0xff, 0xff]),
        ("bin32 claims 4 GiB", &[0xc6, 0xff, 0xff, 0xff, 0xff, 0x00]),
        ("str8 cut", &[0xd9, 0x05, b'a']),
        ("fixext16 cut", &[0xd8, 0x01, 0x00]),
    ];
    for (name, bytes) in cases {
        assert!(wire::decode(bytes, Encoding::MsgPack).is_err(), "{name}");
    }
    assert!(matches!(
        wire::decode(&[0xc0, 0xc0], Encoding::MsgPack),
        Err(WireError::TrailingBytes(1))
    ));
    assert!(matches!(
        wire::decode(&[], Encoding::MsgPack),
        Err(WireError::Empty)
    ));
    // Exactly MAX_DEPTH containers, and one more.
    let nested = |n: usize| {
        let mut b = vec![0x91; n - 1];
        b.push(0x90);
        b
    };
    assert!(wire::decode(&nested(MAX_DEPTH), Encoding::MsgPack).is_ok());
    assert!(matches!(
        wire::decode(&nested(MAX_DEPTH + 1), Encoding::MsgPack),
        Err(WireError::TooDeep)
    ));
    assert!(matches!(
        wire::decode(&vec![0x91; 100_000], Encoding::MsgPack),
        Err(WireError::TooDeep)
    ));
    let json = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert!(wire::decode(json(MAX_DEPTH).as_bytes(), Encoding::Json).is_ok());
    assert!(matches!(
        wire::decode(json(MAX_DEPTH + 1).as_bytes(), Encoding::Json),
        Err(WireError::TooDeep)
    ));
    assert!(matches!(
        wire::decode(json(100_000).as_bytes(), Encoding::Json),
        Err(WireError::TooDeep)
    ));
}

#[test]
fn every_messagepack_marker_the_spec_defines_is_read() {
    let samples: [&[u8]; 34] = [
        &[0x05],
        &[0xe0],
        &[0x80],
        &[0x90],
        &[0xa0],
        &[0xc0],
        &[0xc2],
        &[0xc3],
        &[0xc4, 1, 9],
        &[0xc5, 0, 1, 9],
        &[0xc6, 0, 0, 0, 1, 9],
        &[0xc7, 1, 5, 9],
        &[0xc8, 0, 1, 5, 9],
        &[0xc9, 0, 0, 0, 1, 5, 9],
        &[0xca, 0, 0, 0, 0],
        &[0xcb, 0, 0, 0, 0, 0, 0, 0, 0],
        &[0xcc, 1],
        &[0xcd, 0, 1],
        &[0xce, 0, 0, 0, 1],
        &[0xcf, 0, 0, 0, 0, 0, 0, 0, 1],
        &[0xd0, 1],
        &[0xd1, 0, 1],
        &[0xd2, 0, 0, 0, 1],
        &[0xd3, 0, 0, 0, 0, 0, 0, 0, 1],
        &[0xd4, 1, 0],
        &[0xd5, 1, 0, 0],
        &[0xd6, 1, 0, 0, 0, 0],
        &[0xd7, 1, 0, 0, 0, 0, 0, 0, 0, 0],
        &[0xd8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        &[0xd9, 1, b'a'],
        &[0xda, 0, 1, b'a'],
        &[0xdb, 0, 0, 0, 1, b'a'],
        &[0xdc, 0, 1, 0xc0],
        &[0xde, 0, 1, 0xc0, 0xc0],
    ];
    for bytes in samples {
        let ours = wire::decode(bytes, Encoding::MsgPack);
        let theirs = rmpv::decode::read_value(&mut &bytes[..]);
        assert_eq!(ours.ok(), theirs.ok(), "{bytes:02x?}");
    }
}

/// Arbitrary MessagePack values (no NaN: it is not equal to itself).
fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::Boolean),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e9f64..1e9).prop_map(Value::F64),
        (-1e3f32..1e3).prop_map(Value::F32),
        ".{0,40}".prop_map(|s: String| Value::from(s)),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Value::Binary),
        (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..20))
            .prop_map(|(t, d)| Value::Ext(t, d)),
    ];
    leaf.prop_recursive(6, 200, 12, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..12).prop_map(Value::Array),
            proptest::collection::vec((inner.clone(), inner), 0..12).prop_map(Value::Map),
        ]
    })
}

proptest! {
    #[test]
    fn messagepack_round_trips(value in arb_value()) {
        let bytes = msgpack(&value);
        // Written exactly as rmpv writes valid values: shortest encodings.
        let mut theirs = Vec::new();
        rmpv::encode::write_value(&mut theirs, &value).expect("into a Vec");
        prop_assert_eq!(&bytes, &theirs);
        prop_assert_eq!(wire::decode(&bytes, Encoding::MsgPack).ok(), Some(value));
        // Any strict prefix is refused.
        let cut = bytes.len() / 2;
        prop_assert!(wire::decode(&bytes[..cut], Encoding::MsgPack).is_err());
    }

    #[test]
    fn invalid_utf8_strings_stay_strings(bytes in proptest::collection::vec(128u8..=255, 1..300)) {
        let value = invalid_utf8(&bytes);
        let out = msgpack(&value);
        prop_assert!(matches!(out[0], 0xa0..=0xbf | 0xd9 | 0xda), "a str marker");
        prop_assert!(out.ends_with(&bytes));
        prop_assert_eq!(wire::decode(&out, Encoding::MsgPack).ok(), Some(value));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        for encoding in [Encoding::MsgPack, Encoding::Json] {
            if let Ok(value) = wire::decode(&bytes, encoding) {
                prop_assert!(wire::depth(&value) <= MAX_DEPTH);
            }
        }
    }
}

#[test]
fn the_id_service_answer_and_instance_ids_have_the_contract_shape() {
    use prefill_handoff::ids::{IdLayout, MachineId};
    use prefill_handoff::wire::messages::{instance_id, mint_response};
    let slot = MachineId::new(1020).expect("slot");
    let answer = mint_response(&[11, 12], slot, IdLayout::Rc22);
    assert_eq!(
        wire::to_json(&answer),
        json!({"ids": [11, 12], "machine_id": 1020, "layout": "rc22"})
    );
    assert_eq!(instance_id(0x1a2b), "0000000000001a2b");
    assert_eq!(instance_id(i64::MAX), "7fffffffffffffff");
}

#[test]
fn explain_renders_what_json_cannot_say_readably() {
    let rendered = wire::to_json(&oddities());
    assert_eq!(rendered["bin"][255], 255);
    assert_eq!(
        rendered["ext"],
        json!({"ext_type": 42, "data": [1, 2, 3, 4]})
    );
    assert_eq!(rendered["7"], "an integer key");
    assert_eq!(rendered["latin1"], "caf\u{fffd}");
    assert_eq!(rendered["big"], json!(u64::MAX));
    assert_eq!(rendered["neg"], -3);
}
