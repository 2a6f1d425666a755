//! Every input yields exactly one output, and hostile input never panics the
//! worker or makes it publish where it must not (contract 4.2).

use crate::decision_support;

use decision_support::*;
use prefill_handoff::decision::{Input, decide};
use prefill_handoff::wire::{self, Encoding};
use proptest::prelude::*;
use rmpv::Value;

fn k(s: &str) -> Value {
    Value::from(s)
}

/// Scalars and small trees of every MessagePack type.
fn anything() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::Boolean),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::from((1u64 << 63) - 1)),
        Just(Value::from(1u64 << 63)),
        Just(Value::from(0)),
        any::<f64>().prop_map(Value::F64),
        ".{0,12}".prop_map(|s: String| Value::from(s)),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(Value::Binary),
        (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..4))
            .prop_map(|(t, d)| Value::Ext(t, d)),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

/// A value that is often one the contract names, sometimes anything.
fn one_of(known: &'static [&'static str]) -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => proptest::sample::select(known).prop_map(k),
        1 => anything(),
    ]
}

/// A value that is mostly the good one, sometimes a known bad one, sometimes
/// anything.
fn mostly(good: &'static str, bad: &'static [&'static str]) -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => Just(k(good)),
        1 => proptest::sample::select(bad).prop_map(k),
        1 => anything(),
    ]
}

/// An optional map entry.
fn entry(
    key: &'static str,
    value: impl Strategy<Value = Value>,
) -> impl Strategy<Value = Option<(Value, Value)>> {
    entry_p(key, 0.7, value)
}

fn entry_p(
    key: &'static str,
    p: f64,
    value: impl Strategy<Value = Value>,
) -> impl Strategy<Value = Option<(Value, Value)>> {
    proptest::option::weighted(p, value.prop_map(move |v| (k(key), v)))
}

fn map_of(entries: Vec<Option<(Value, Value)>>) -> Value {
    Value::Map(entries.into_iter().flatten().collect())
}

fn params() -> impl Strategy<Value = Value> {
    let int = || {
        prop_oneof![
            4 => (1u64..70_000).prop_map(Value::from),
            1 => Just(Value::from((1u64 << 63) - 1)),
            1 => anything(),
        ]
    };
    let block_ids = prop_oneof![
        3 => proptest::collection::vec((0u64..1000).prop_map(Value::from), 0..4).prop_map(Value::Array),
        1 => anything(),
    ];
    // Each engine's keys on their own, as engines send them; sometimes mixed.
    let trtllm = (
        entry_p("ctx_request_id", 0.9, int()),
        entry("request_type", mostly("context_only", &["generation_only"])),
        entry_p("disagg_request_id", 0.4, int()),
        entry("opaque_state", anything()),
    )
        .prop_map(|(a, b, c, d)| vec![a, b, c, d]);
    let sglang = (
        entry_p("bootstrap_host", 0.9, mostly("10.0.0.1", &[""])),
        entry_p("bootstrap_port", 0.9, int()),
        entry_p("bootstrap_room", 0.9, int()),
    )
        .prop_map(|(a, b, c)| vec![a, b, c]);
    let vllm = (
        entry("do_remote_prefill", anything()),
        entry_p("remote_engine_id", 0.9, mostly("engine", &[""])),
        entry_p("remote_block_ids", 0.9, block_ids),
        entry("remote_port", int()),
    )
        .prop_map(|(a, b, c, d)| vec![a, b, c, d]);
    let opaque =
        proptest::collection::vec((".{1,8}".prop_map(|s: String| k(&s)), anything()), 0..3)
            .prop_map(|entries| entries.into_iter().map(Some).collect::<Vec<_>>());
    prop_oneof![
        3 => trtllm.prop_map(map_of),
        2 => sglang.prop_map(map_of),
        2 => vllm.prop_map(map_of),
        1 => opaque.prop_map(map_of),
        1 => (trtllm_mix(), sglang_mix()).prop_map(|(a, b)| map_of(vec![a, b])),
    ]
}

fn trtllm_mix() -> impl Strategy<Value = Option<(Value, Value)>> {
    entry("ctx_request_id", anything())
}

fn sglang_mix() -> impl Strategy<Value = Option<(Value, Value)>> {
    entry("bootstrap_host", anything())
}

fn frame() -> impl Strategy<Value = Value> {
    (
        entry(
            "finish_reason",
            one_of(&[
                "length",
                "not_finished",
                "length",
                "eos",
                "stop",
                "error",
                "x",
            ]),
        ),
        entry_p(
            "disaggregated_params",
            0.9,
            prop_oneof![8 => params(), 1 => anything()],
        ),
        proptest::option::weighted(0.15, anything().prop_map(|v| (k("error"), v))),
        entry("text", anything()),
    )
        .prop_map(|(a, b, c, d)| map_of(vec![a, b, c, d]))
}

fn message() -> impl Strategy<Value = Value> {
    (
        entry_p("request_id", 0.95, mostly("req-1", &["", "a\r\nb", "%"])),
        entry_p(
            "reply_to",
            0.9,
            mostly(
                REPLY,
                &["$JS.API.STREAM.DELETE.X", "_INBOX.*", GEN, "a b", ""],
            ),
        ),
        entry_p(
            "frames",
            0.95,
            prop_oneof![
                8 => proptest::collection::vec(frame(), 1..3).prop_map(Value::Array),
                1 => Just(Value::Array(vec![])),
                1 => anything(),
            ],
        ),
        entry_p(
            "request",
            0.5,
            prop_oneof![
                4 => proptest::collection::vec((anything(), anything()), 0..3).prop_map(Value::Map),
                1 => anything(),
            ],
        ),
        proptest::option::weighted(0.3, (anything(), anything())),
    )
        .prop_map(|(a, b, c, d, e)| map_of(vec![a, b, c, d, e]))
}

fn nats_reply() -> impl Strategy<Value = Option<&'static str>> {
    proptest::option::of(proptest::sample::select(
        &["_INBOX.n.1", "$JS.ACK.X.y.1", "llm.replies.z", GEN][..],
    ))
}

fn run(payload: &[u8], encoding: Encoding, jetstream: bool, nats_reply: Option<&str>) {
    let rules = if jetstream {
        jetstream_rules()
    } else {
        rules()
    };
    let input = Input {
        nats_reply,
        ..input(payload, encoding)
    };
    let d = decide(input, &rules, &mut TestIds::holding_slot());
    invariants::check(&d, payload, encoding, &rules);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn structured_hostile_messages(
        m in message(),
        jetstream in any::<bool>(),
        reply in nats_reply(),
    ) {
        run(&wire::encode(&m, Encoding::MsgPack), Encoding::MsgPack, jetstream, reply);
        run(&wire::encode(&m, Encoding::Json), Encoding::Json, jetstream, reply);
    }

    #[test]
    fn arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        reply in nats_reply(),
    ) {
        run(&bytes, Encoding::MsgPack, false, reply);
        run(&bytes, Encoding::Json, false, reply);
    }

    #[test]
    fn corrupted_good_messages(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let good = wire::encode(&v(needs_decode(trt())), Encoding::MsgPack);
        let mut bytes = good.clone();
        for (i, b) in flips {
            let at = i.index(bytes.len());
            bytes[at] = b;
        }
        run(&bytes, Encoding::MsgPack, false, Some("_INBOX.n.1"));
    }
}
