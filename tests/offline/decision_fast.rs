//! The in-place MessagePack path decides exactly as the value-tree path does:
//! same outcome, subject, headers, payload bytes and counts, and the same IDs
//! minted — for generated results near the contract's shapes, for hostile
//! byte-level mutations of them, and for non-canonical encodings.

use crate::decision_support;

use decision_support::*;
use prefill_handoff::config::{KvHoldConfig, MissingDisaggRequestId};
use prefill_handoff::decision::{
    Cancelled, Cancels, Decision, Input, NO_CANCELS, Outcome, Rules, decide, decide_in_place,
    decide_values,
};
use prefill_handoff::wire::{self, Encoding};
use proptest::prelude::*;
use rmpv::Value;

fn k(s: &str) -> Value {
    Value::from(s)
}

/// Scalars and small trees of every MessagePack type.
pub(crate) fn anything() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::Boolean),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::from((1u64 << 63) - 1)),
        Just(Value::from(0)),
        any::<f32>().prop_map(Value::F32),
        ".{0,40}".prop_map(|s: String| Value::from(s)),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Value::Binary),
        (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..20))
            .prop_map(|(t, d)| Value::Ext(t, d)),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..18).prop_map(Value::Array),
            proptest::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

/// Mostly one of the named values, sometimes anything, sometimes absent.
pub(crate) fn field_of(known: Vec<Value>) -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        6 => proptest::sample::select(known).prop_map(Some),
        1 => anything().prop_map(Some),
        1 => Just(None),
    ]
}

fn map_of(entries: Vec<(&str, Option<Value>)>, extra: Vec<(Value, Value)>) -> Value {
    let mut m: Vec<(Value, Value)> = entries
        .into_iter()
        .filter_map(|(key, v)| v.map(|v| (k(key), v)))
        .collect();
    m.extend(extra);
    Value::Map(m)
}

fn params() -> impl Strategy<Value = Value> {
    let ints = || {
        vec![
            Value::from(0),
            Value::from(7),
            Value::from(1_234_567),
            Value::from((1u64 << 63) - 1),
            Value::from(1u64 << 63),
            Value::from(-1),
            Value::Nil,
        ]
    };
    let trt = (
        field_of(ints()),
        field_of(vec![
            k("context_only"),
            k("CONTEXT_ONLY"),
            k("Context_Only"),
            k("generation_only"),
            Value::Nil,
        ]),
        field_of(ints()),
        field_of(vec![Value::Binary((0..=255).collect())]),
        // trtllm-serve's JSON: base64 opaque state, the endpoint as a
        // string or a list.
        field_of(vec![k("AAH/"), Value::Nil]),
        field_of(vec![
            k("tcp://10.0.0.5:8001"),
            v(serde_json::json!([
                "tcp://10.0.0.5:8001",
                "tcp://10.0.0.5:8002"
            ])),
        ]),
        proptest::collection::vec((anything(), anything()), 0..3),
    )
        .prop_map(|(ctx, kind, disagg, opaque, encoded, endpoint, extra)| {
            map_of(
                vec![
                    ("ctx_request_id", ctx),
                    ("request_type", kind),
                    ("disagg_request_id", disagg),
                    ("opaque_state", opaque),
                    ("encoded_opaque_state", encoded),
                    ("ctx_info_endpoint", endpoint),
                ],
                extra,
            )
        });
    prop_oneof![
        6 => trt,
        1 => Just(v(sglang())),
        1 => Just(v(vllm())),
        2 => engine_params(),
        1 => proptest::collection::vec((anything(), anything()), 0..4).prop_map(Value::Map),
        1 => anything(),
    ]
}

/// SGLang and vLLM params near the edges of their checks (both decided in
/// place): ports around 1..=65535, empty and non-string hosts, block IDs
/// that are negative or not integers, fields missing or null.
pub(crate) fn engine_params() -> impl Strategy<Value = Value> {
    let ints = || {
        vec![
            Value::from(0),
            Value::from(1_234_567),
            Value::from((1u64 << 63) - 1),
            Value::from(1u64 << 63),
            Value::from(-1),
            Value::Nil,
        ]
    };
    let ports = || {
        vec![
            Value::from(0),
            Value::from(1),
            Value::from(8998),
            Value::from(65535),
            Value::from(65536),
            Value::from(-1),
            k("8998"),
            Value::Nil,
        ]
    };
    let hosts = || vec![k("10.0.0.5"), k(""), Value::Nil, Value::from(5)];
    let sglang_near = (
        field_of(hosts()),
        field_of(ports()),
        field_of(ints()),
        proptest::collection::vec((anything(), anything()), 0..2),
    )
        .prop_map(|(host, port, room, extra)| {
            map_of(
                vec![
                    ("bootstrap_host", host),
                    ("bootstrap_port", port),
                    ("bootstrap_room", room),
                ],
                extra,
            )
        });
    let blocks = vec![
        v(serde_json::json!([0, 1, 2])),
        v(serde_json::json!([])),
        v(serde_json::json!([0, -1])),
        v(serde_json::json!([7, "8"])),
        v(serde_json::json!([18446744073709551615u64])),
        // One list per KV-cache group, and near misses.
        v(serde_json::json!([[0, 1, 2], [3]])),
        v(serde_json::json!([[], []])),
        v(serde_json::json!([[0], [-1]])),
        v(serde_json::json!([[0], 1])),
        v(serde_json::json!([[[0]]])),
        Value::Nil,
    ];
    let vllm_near = (
        field_of(hosts()),
        field_of(blocks),
        field_of(ports()),
        field_of(vec![Value::Boolean(true)]),
        proptest::collection::vec((anything(), anything()), 0..2),
    )
        .prop_map(|(engine, blocks, port, remote, extra)| {
            map_of(
                vec![
                    ("do_remote_prefill", remote),
                    ("remote_engine_id", engine),
                    ("remote_block_ids", blocks),
                    ("remote_port", port),
                ],
                extra,
            )
        })
        .boxed();
    // Dynamo's nesting of vLLM's params, with a key beside it or not.
    let nested = (
        prop_oneof![
            3 => vllm_near.clone(),
            1 => anything(),
        ],
        proptest::collection::vec((anything(), anything()), 0..2),
    )
        .prop_map(|(inner, extra)| map_of(vec![("kv_transfer_params", Some(inner))], extra));
    prop_oneof![sglang_near, vllm_near, nested]
}

fn gen_frame() -> impl Strategy<Value = Value> {
    let reasons = vec![
        k("length"),
        k("not_finished"),
        k("stop"),
        k("abort"),
        k("error"),
        Value::Nil,
        v(serde_json::json!({"error": "x"})),
    ];
    (
        field_of(reasons),
        prop_oneof![
            8 => Just(None),
            1 => Just(Some(Value::Nil)),
            1 => anything().prop_map(Some),
            // A prefill error's text, often past the 1 KiB its message keeps.
            1 => "\\PC{0,400}".prop_map(|s: String| Some(Value::from(s))),
        ],
        prop_oneof![6 => params().prop_map(Some), 1 => Just(None)],
        proptest::collection::vec((anything(), anything()), 0..3),
    )
        .prop_map(|(reason, error, params, extra)| {
            let mut base = vec![
                ("token_ids", Some(Value::Array(vec![Value::from(791)]))),
                ("text", Some(k("The"))),
                ("finish_reason", reason),
                ("error", error),
                ("disaggregated_params", params),
            ];
            base.rotate_left(extra.len() % 5);
            map_of(base, extra)
        })
}

/// The time of every generated decision, Unix ms.
const NOW: u64 = 1_767_225_600_000;
/// When every generated result was published: 10 ms before [`NOW`].
const PUBLISHED: u64 = NOW - 10;

/// Deadlines near [`NOW`] and the edges of their range, and values that are
/// not deadlines.
pub(crate) fn deadlines() -> Vec<Value> {
    vec![
        Value::from(NOW - 1),
        Value::from(NOW),
        Value::from(NOW + 1),
        Value::from(NOW + 60_000),
        Value::from(0),
        Value::from((1u64 << 63) - 1),
        Value::from(1u64 << 63),
        Value::from(-1),
        Value::F64(NOW as f64),
        k("1767225600000"),
        Value::Nil,
    ]
}

/// `Handoff-Deadline` header values: mostly none, else near [`NOW`], at
/// the range's edges, or not a deadline.
pub(crate) fn deadline_header() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(None),
        2 => proptest::sample::select(vec![
            (NOW - 1).to_string(),
            NOW.to_string(),
            (NOW + 1).to_string(),
            (NOW + 60_000).to_string(),
            " 0 ".to_string(),
            ((1u64 << 63) - 1).to_string(),
            (1u64 << 63).to_string(),
            "-1".to_string(),
            "1.5".to_string(),
            String::new(),
        ]).prop_map(Some),
        1 => "[0-9 a-z.+-]{0,21}".prop_map(Some),
    ]
}

/// `req-1` cancelled, with a reason.
struct Req1Cancelled;

impl Cancels for Req1Cancelled {
    fn lookup(&self, request_id: &str, _: u64) -> Option<Cancelled> {
        (request_id == "req-1").then(|| Cancelled {
            reason: Some("client gone".into()),
        })
    }
}

pub(crate) fn gen_result() -> impl Strategy<Value = Value> {
    let job_keys = [
        "backend",
        "worker",
        "handoff",
        "prefill_output",
        "disagg_request_id",
    ];
    (
        field_of(vec![
            k("req-1"),
            k("x".repeat(256).as_str()),
            k(""),
            Value::from(5),
        ]),
        field_of(vec![
            k(REPLY),
            k("_INBOX.a b"),
            k("llm.gen.jobs"),
            Value::Nil,
        ]),
        prop_oneof![
            8 => proptest::collection::vec(gen_frame(), 0..3).prop_map(|f| Some(Value::Array(f))),
            1 => anything().prop_map(Some),
            1 => Just(None),
        ],
        field_of(vec![
            v(serde_json::json!({"model": "m", "token_ids": [1, 2, 3]})),
            Value::Nil,
        ]),
        prop_oneof![2 => Just(None), 1 => field_of(deadlines())],
        prop_oneof![2 => Just(None), 1 => field_of(deadlines())],
        proptest::collection::vec(
            (
                prop_oneof![
                    proptest::sample::select(job_keys.to_vec()).prop_map(k),
                    anything()
                ],
                anything(),
            ),
            0..3,
        ),
        0usize..4,
    )
        .prop_map(
            |(id, reply, frames, request, deadline, kv_expires, extra, turn)| {
                let mut base = vec![
                    ("request_id", id),
                    ("reply_to", reply),
                    ("frames", frames),
                    ("request", request),
                    ("deadline_ms", deadline),
                    ("kv_expires_ms", kv_expires),
                ];
                base.rotate_left(turn);
                map_of(base, extra)
            },
        )
}

/// Both paths on the same bytes, each with a fresh ID source.
fn both(
    payload: &[u8],
    encoding: Encoding,
    rules: &Rules,
    nats_reply: Option<&str>,
    fenced: bool,
    header: Option<&str>,
    cancels: &dyn Cancels,
) -> (Decision, Decision, usize, usize) {
    let input = Input {
        nats_reply,
        deadline_header: header,
        now_ms: NOW,
        published_ms: PUBLISHED,
        cancels,
        ..input(payload, encoding)
    };
    let ids = || {
        if fenced {
            TestIds::fenced()
        } else {
            TestIds::holding_slot()
        }
    };
    let (mut a, mut b) = (ids(), ids());
    let fast = decide(input, rules, &mut a);
    let slow = decide_values(input, rules, &mut b);
    (fast, slow, a.minted, b.minted)
}

fn check_same(payload: &[u8]) -> Result<(), TestCaseError> {
    check_same_with(payload, None)
}

/// [`check_same`] with a `Handoff-Deadline` header, and with `req-1`
/// cancelled or not.
fn check_same_with(payload: &[u8], header: Option<&str>) -> Result<(), TestCaseError> {
    check_same_in(payload, Encoding::MsgPack, header)
}

/// Whether a JSON body is written as the value-tree path writes JSON: then
/// the in-place path's outputs are the same bytes.
fn canonical_json(body: &[u8]) -> bool {
    wire::decode(body, Encoding::Json).is_ok_and(|v| wire::encode(&v, Encoding::Json) == body)
}

/// A JSON decision's payloads as the value-tree path writes JSON. The
/// in-place path keeps the producer's text of the values it only copies
/// (spacing, escapes, number forms), so on other bodies the paths' outputs
/// are compared as JSON values, key order included.
fn as_the_tree_writes(mut decision: Decision) -> Decision {
    let rewrite = |payload: &mut Vec<u8>| {
        if let Ok(value) = wire::decode(payload, Encoding::Json) {
            *payload = wire::encode(&value, Encoding::Json);
        }
    };
    rewrite(&mut decision.payload);
    if let Some(release) = decision.release.as_mut() {
        rewrite(&mut release.payload);
    }
    decision
}

/// [`check_same_with`] for a body in `encoding`: byte for byte, but for
/// the text of copied values in a JSON body the value-tree path would
/// write otherwise.
pub(crate) fn check_same_in(
    payload: &[u8],
    encoding: Encoding,
    header: Option<&str>,
) -> Result<(), TestCaseError> {
    // Four combinations: each rule's case comes up under more than one.
    let skewed_jetstream = Rules {
        deadline_skew_ms: 1,
        ..jetstream_rules()
    };
    let req_1_cancelled: &dyn Cancels = &Req1Cancelled;
    // The configuration's own ID policy (refuse), and holds that have run
    // out (vLLM, TensorRT-LLM) and not (SGLang) at NOW.
    let refusing_with_holds = Rules {
        kv_hold_ms: KvHoldConfig {
            trtllm: 10,
            vllm: 5,
            sglang: 50,
            opaque: 0,
        },
        ..default_rules()
    };
    let passing = Rules {
        missing_disagg_request_id: MissingDisaggRequestId::Pass,
        ..jetstream_rules()
    };
    for (rules, nats_reply, fenced, cancels) in [
        (
            refusing_with_holds,
            Some("_INBOX.nats.9"),
            false,
            NO_CANCELS,
        ),
        (rules(), None, true, req_1_cancelled),
        (
            skewed_jetstream,
            Some("_INBOX.nats.9"),
            false,
            req_1_cancelled,
        ),
        (passing, None, true, NO_CANCELS),
    ] {
        let (fast, slow, minted_fast, minted_slow) = both(
            payload, encoding, &rules, nats_reply, fenced, header, cancels,
        );
        if encoding == Encoding::MsgPack || canonical_json(payload) {
            prop_assert_eq!(&fast, &slow);
        } else {
            prop_assert_eq!(as_the_tree_writes(fast), as_the_tree_writes(slow));
        }
        prop_assert_eq!(minted_fast, minted_slow);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn generated_results_decide_the_same(
        message in gen_result(),
        header in deadline_header(),
    ) {
        check_same_with(&msgpack(&message), header.as_deref())?;
    }

    #[test]
    fn engine_handoffs_decide_the_same(
        params in engine_params(),
        deadline in field_of(deadlines()),
        header in deadline_header(),
    ) {
        let frame = Value::Map(vec![
            (k("token_ids"), Value::Array(vec![Value::from(791)])),
            (k("finish_reason"), k("length")),
            (k("disaggregated_params"), params),
        ]);
        let mut message = vec![
            (k("request_id"), k("req-1")),
            (k("reply_to"), k(REPLY)),
            (k("frames"), Value::Array(vec![frame])),
        ];
        if let Some(deadline) = deadline {
            message.push((k("deadline_ms"), deadline));
        }
        check_same_with(&msgpack(&Value::Map(message)), header.as_deref())?;
    }

    #[test]
    fn mutated_bytes_decide_the_same(
        message in gen_result(),
        header in deadline_header(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..4),
    ) {
        let mut bytes = msgpack(&message);
        for (at, byte, how) in edits {
            if bytes.is_empty() {
                break;
            }
            let i = at.index(bytes.len());
            match how {
                0 => bytes[i] = byte,
                1 => bytes.insert(i, byte),
                _ => { bytes.remove(i); }
            }
        }
        check_same_with(&bytes, header.as_deref())?;
    }
}

/// A typical TensorRT-LLM, SGLang and vLLM handoff result and a terminal
/// one are decided in place (so the equality above covers the in-place path, not just the
/// fallback), and a non-canonical encoding of the same is not.
#[test]
fn typical_results_are_decided_in_place() {
    let handoff = msgpack(&v(needs_decode(without(trt(), "disagg_request_id"))));
    let terminal = msgpack(&v(result_json_terminal()));
    let sglang_handoff = msgpack(&v(needs_decode(sglang())));
    let vllm_handoff = msgpack(&v(needs_decode(vllm())));
    let no_ctx_request_id = msgpack(&v(needs_decode(without(trt(), "ctx_request_id"))));
    let prefill_error = |text: &str| {
        let mut frame = frame(Some(serde_json::json!("error")), None);
        frame["error"] = serde_json::json!(text);
        msgpack(&v(result(serde_json::json!([frame]))))
    };
    // Past 1 KiB, cut inside a three-byte character.
    let long_error = prefill_error(&format!("{}€{}", "x".repeat(1023), "y".repeat(10)));
    for (payload, kind) in [
        (&handoff, "decode"),
        (&terminal, "terminal"),
        (&sglang_handoff, "decode"),
        (&vllm_handoff, "decode"),
        (&no_ctx_request_id, "error"),
        (&prefill_error("CUDA error: out of memory"), "error"),
        (&long_error, "error"),
    ] {
        let input = input(payload, Encoding::MsgPack);
        let d = decide_in_place(input, &rules(), &mut TestIds::holding_slot())
            .unwrap_or_else(|| panic!("a typical {kind} result is decided in place"));
        assert_eq!(d.outcome.kind(), kind);
        check_same(payload).unwrap();
    }
    assert!(matches!(
        decide_bytes(&handoff, Encoding::MsgPack, &rules(), None).outcome,
        Outcome::Decode { minted: true, .. }
    ));
    // ctx_request_id 7 as uint8 (0xcc 0x07) instead of a fixint.
    let at = handoff
        .windows(15)
        .position(|w| &w[1..] == b"ctx_request_id")
        .expect("the key is there")
        + 15;
    assert_eq!(handoff[at], 0x07);
    let mut odd = handoff.clone();
    odd.splice(at..=at, [0xcc, 0x07]);
    let input = input(&odd, Encoding::MsgPack);
    assert!(decide_in_place(input, &rules(), &mut TestIds::holding_slot()).is_none());
    check_same(&odd).unwrap();
}

fn result_json_terminal() -> serde_json::Value {
    result(serde_json::json!([frame(
        Some(serde_json::json!("stop")),
        Some(trt())
    )]))
}
