//! No valid result is refused for its shape (contract 11): results valid
//! under the contract, with up to 64 extra keys in every map the decision
//! reads and up to 200,000 values, are decided alike by every path (in
//! place and as value trees, from MessagePack and from JSON), and decided
//! as a handoff or a terminal response, never refused.
//!
//! The engines' own shapes come first: each is decided as a handoff of its
//! engine and its params are passed on exactly as received (for TensorRT-LLM,
//! but for the two keys it rewrites).

use crate::decision_support;

use decision_support::*;
use prefill_handoff::decision::{Backend, Decision, Outcome, decide, decide_values};
use prefill_handoff::wire::{self, Encoding};
use proptest::prelude::*;
use rmpv::Value;
use serde_json::{Value as Json, json};

/// `decide` and `decide_values` on the same bytes, with fresh ID sources.
fn both(payload: &[u8], encoding: Encoding) -> (Decision, Decision) {
    let input = input(payload, encoding);
    let rules = rules();
    let fast = decide(input, &rules, &mut TestIds::holding_slot());
    let slow = decide_values(input, &rules, &mut TestIds::holding_slot());
    (fast, slow)
}

/// The engines' params as they send them (see docs/protocol.md, "The
/// engines' flows"), and the backend each must be decided as.
fn engine_shapes() -> Vec<(&'static str, Json, Backend)> {
    let vllm_grouped = json!({
        "do_remote_prefill": true, "do_remote_decode": false,
        "remote_engine_id": "prefill-0", "remote_host": "10.0.0.6", "remote_port": 5600,
        "tp_size": 1, "remote_block_ids": [[0, 1, 2], [3, 4, 5]],
    });
    vec![
        (
            "TensorRT-LLM, the ID minted before the context phase",
            json!({"request_type": "context_only", "ctx_request_id": 4242,
                   "disagg_request_id": 1_099_511_627_777u64, "opaque_state": "AAH/",
                   "first_gen_tokens": [9707], "draft_tokens": null, "ctx_dp_rank": 0,
                   "ctx_info_endpoint": ["tcp://10.0.0.5:8001"]}),
            Backend::Trtllm,
        ),
        (
            "TensorRT-LLM's enum name, trtllm-serve's JSON",
            json!({"request_type": "CONTEXT_ONLY", "ctx_request_id": 4242,
                   "disagg_request_id": 1_099_511_627_777u64,
                   "encoded_opaque_state": "AAH/", "ctx_info_endpoint": "tcp://10.0.0.5:8001"}),
            Backend::Trtllm,
        ),
        (
            "vLLM, one block list per KV-cache group",
            vllm_grouped.clone(),
            Backend::Vllm,
        ),
        (
            "vLLM nested by Dynamo",
            json!({"kv_transfer_params": vllm_grouped}),
            Backend::Vllm,
        ),
        (
            "SGLang, the engine's default port",
            json!({"bootstrap_host": "10.0.0.7", "bootstrap_port": null, "bootstrap_room": 7421}),
            Backend::Sglang,
        ),
    ]
}

#[test]
fn each_engines_real_shape_is_its_handoff_and_passed_on_as_received() {
    for (name, params, backend) in engine_shapes() {
        let result = json!({
            "request_id": "r-1", "reply_to": REPLY,
            "frames": [{"token_ids": [9707], "finish_reason": "length", "disaggregated_params": params}],
        });
        // MessagePack with `opaque_state` as binary, as engines send it.
        let mut value = v(result.clone());
        if let Some(opaque) = path_mut(
            &mut value,
            &["frames", "0", "disaggregated_params", "opaque_state"],
        ) {
            *opaque = Value::Binary(vec![0x00, 0x01, 0xff]);
        }
        for (encoding, body) in [
            (Encoding::MsgPack, msgpack(&value)),
            (Encoding::Json, serde_json::to_vec(&result).unwrap()),
        ] {
            let (d, tree) = both(&body, encoding);
            assert_eq!(d, tree, "{name} {encoding:?}: the paths agree");
            assert_eq!(
                d.outcome,
                Outcome::Decode {
                    backend,
                    minted: false
                },
                "{name} {encoding:?}: {:?}",
                d.detail
            );
            let input = wire::decode(&body, encoding).unwrap();
            let job = wire::decode(&d.payload, encoding).unwrap();
            let sent = get(&input, &["frames", "0", "disaggregated_params"]);
            let mut passed = get(&job, &["handoff"]).clone();
            if backend == Backend::Trtllm {
                // The two keys TensorRT-LLM's generation phase needs
                // rewritten; every other byte as received.
                set(
                    &mut passed,
                    "request_type",
                    get(sent, &["request_type"]).clone(),
                );
            }
            assert_eq!(&passed, sent, "{name} {encoding:?}");
            assert_eq!(
                wire::encode(&passed, encoding),
                wire::encode(sent, encoding),
                "{name} {encoding:?}: byte for byte"
            );
        }
    }
}

fn get<'a>(value: &'a Value, keys: &[&str]) -> &'a Value {
    keys.iter().fold(value, |v, key| match v {
        Value::Map(m) => m
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no {key}")),
        Value::Array(a) => &a[key.parse::<usize>().unwrap()],
        _ => panic!("{key} in a scalar"),
    })
}

fn path_mut<'a>(value: &'a mut Value, keys: &[&str]) -> Option<&'a mut Value> {
    keys.iter().try_fold(value, |v, key| match v {
        Value::Map(m) => m
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v),
        Value::Array(a) => a.get_mut(key.parse::<usize>().ok()?),
        _ => None,
    })
}

fn set(map: &mut Value, key: &str, to: Value) {
    if let Some(v) = path_mut(map, &[key]) {
        *v = to;
    }
}

/// A valid result: one engine's params, `n` extra keys added to the top
/// level, the first frame and the params (and the nested vLLM params), and
/// `values` token IDs in the prompt, the frame or the draft tokens.
fn valid_result(
    engine: usize,
    n: (usize, usize, usize),
    values: usize,
    place: usize,
    terminal: bool,
) -> Json {
    let (top_n, frame_n, params_n) = n;
    let widen = |map: &mut Json, n: usize, prefix: &str| {
        for i in 0..n {
            let value = match i % 4 {
                0 => json!(i),
                1 => json!(format!("v{i}")),
                2 => json!([i, {"k": i}]),
                _ => Json::Null,
            };
            map[format!("{prefix}{i}")] = value;
        }
    };
    // Token IDs under 1,000, so that 200,000 of them fit 1 MiB of JSON.
    let tokens: Vec<u64> = (0..values as u64)
        .map(|i| i * 2_654_435_761 % 1_000)
        .collect();
    let mut params = match engine_shapes().into_iter().nth(engine) {
        Some((_, params, _)) => params,
        None => json!({"custom_engine": "x"}),
    };
    if params.get("kv_transfer_params").is_some() {
        widen(&mut params["kv_transfer_params"], params_n, "n");
    }
    widen(&mut params, params_n, "p");
    let mut first = json!({"token_ids": [9707], "text": "The",
                           "finish_reason": if terminal { "stop" } else { "length" },
                           "disaggregated_params": params});
    widen(&mut first, frame_n, "f");
    let mut result = json!({"request_id": "r-1", "reply_to": REPLY,
                            "frames": [first, {"token_ids": [1]}], "request": {"model": "m"}});
    widen(&mut result, top_n, "t");
    match place {
        0 => result["request"]["prompt_token_ids"] = json!(tokens),
        1 => result["frames"][0]["token_ids"] = json!(tokens),
        _ => result["frames"][0]["disaggregated_params"]["draft_tokens"] = json!(tokens),
    }
    result
}

proptest! {
    // Few cases: each decides up to 200,000 values four times, in a debug
    // build.
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn valid_results_of_any_width_and_size_decide_alike(
        engine in 0usize..6,
        n in (0usize..=64, 0usize..=64, 0usize..=64),
        values in prop_oneof![Just(0usize), 0usize..2_000, 30_000usize..=200_000],
        place in 0usize..3,
        terminal in proptest::bool::weighted(0.2),
    ) {
        let result = valid_result(engine, n, values, place, terminal);
        let mut outcomes = Vec::new();
        for (encoding, body) in [
            (Encoding::MsgPack, msgpack(&v(result.clone()))),
            (Encoding::Json, serde_json::to_vec(&result).unwrap()),
        ] {
            let (d, tree) = both(&body, encoding);
            prop_assert_eq!(&d, &tree, "{:?}: in place and as a tree", encoding);
            prop_assert!(
                matches!(d.outcome, Outcome::Decode { .. } | Outcome::Terminal { .. }),
                "{:?}: {:?} {:?}", encoding, d.outcome, d.detail
            );
            outcomes.push(d.outcome);
        }
        prop_assert_eq!(&outcomes[0], &outcomes[1]);
    }
}
