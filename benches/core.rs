//! Micro-benchmarks of the pure core: decisions per second for a typical
//! TensorRT-LLM handoff result, and request IDs per second per slot.
//!
//! `cargo bench --bench core` (add `-- --quick` for a short run).

use criterion::{Criterion, Throughput, criterion_group};
use prefill_handoff::clock;
use prefill_handoff::config::{Config, MissingDisaggRequestId};
use prefill_handoff::decision::{Decision, IdSource, Input, Rules, decide, decide_values};
use prefill_handoff::identity::Identity;
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdGenerator, IdLayout, MachineId};
use prefill_handoff::wire::{self, Encoding, map};
use prefill_handoff_loadgen::Kind;
use prefill_handoff_loadgen::payload::{self, RunIds, Tag, Template};
use rmpv::Value;
use serde_json::json;
use std::hint::black_box;

/// A prefill result as TensorRT-LLM's context phase returns it through
/// Dynamo: a few tokens, a 256-byte opaque_state, and the original request.
fn typical_result(finish_reason: Value, disagg_request_id: Option<u64>) -> Value {
    let mut params = trtllm_params();
    if let Some(id) = disagg_request_id {
        params.push((Value::from("disagg_request_id"), Value::from(id)));
    }
    result_with(finish_reason, params)
}

fn trtllm_params() -> Vec<(Value, Value)> {
    vec![
        (Value::from("ctx_request_id"), Value::from(1_234_567_u64)),
        (Value::from("request_type"), Value::from("context_only")),
        (
            Value::from("opaque_state"),
            Value::Binary((0..=255u8).collect()),
        ),
        (
            Value::from("first_gen_tokens"),
            Value::Array(vec![Value::from(791)]),
        ),
        (Value::from("draft_tokens"), Value::Nil),
    ]
}

/// The same result with another engine's params.
fn engine_result(params: serde_json::Value) -> Value {
    match rmpv::ext::to_value(params).expect("params") {
        Value::Map(params) => result_with(Value::from("length"), params),
        other => panic!("params are a map, not {other}"),
    }
}

fn result_with(finish_reason: Value, params: Vec<(Value, Value)>) -> Value {
    let frame = Value::Map(vec![
        (
            Value::from("token_ids"),
            Value::Array(vec![Value::from(791)]),
        ),
        (Value::from("text"), Value::from("The")),
        (Value::from("finish_reason"), finish_reason),
        (Value::from("disaggregated_params"), Value::Map(params)),
        (
            Value::from("completion_usage"),
            rmpv::ext::to_value(
                json!({"prompt_tokens": 412, "completion_tokens": 1, "total_tokens": 413}),
            )
            .expect("usage"),
        ),
    ]);
    let request = rmpv::ext::to_value(json!({
        "model": "meta-llama/Llama-3.1-70B-Instruct",
        "token_ids": (0..64).collect::<Vec<u32>>(),
        "stop_conditions": {"max_tokens": 512, "stop": ["</s>"]},
        "sampling_options": {"temperature": 0.7, "top_p": 0.95, "seed": 42},
        "eos_token_ids": [128001, 128009],
    }))
    .expect("request");
    let mut top = vec![
        (
            Value::from("request_id"),
            Value::from("chatcmpl-6f1c2d9e-8a44-4c1e-9b57-3f0a2e5d7c11"),
        ),
        (
            Value::from("reply_to"),
            Value::from("_INBOX.Jq8zYk2Lr4Pw7Xs1Vb3Nc5.1"),
        ),
        (Value::from("frames"), Value::Array(vec![frame])),
    ];
    map::set(&mut top, "request", request);
    Value::Map(top)
}

/// A TensorRT-LLM handoff as `loadgen` builds it (256-byte opaque state).
fn loadgen_result() -> Value {
    let template = Template {
        reply_to: "_INBOX.loadgen.bench".into(),
        refused_reply_to: "refused".into(),
        opaque_bytes: 256,
    };
    let request_id = RunIds::new("bench").request_id(Tag::Measured(4242));
    let bytes = payload::encode(&template, Kind::Trtllm, &request_id, 4242, 0);
    rmpv::decode::read_value(&mut bytes.as_slice()).expect("loadgen writes MessagePack")
}

/// [`loadgen_result`] as `loadgen --json-results` sends it: JSON, the
/// opaque state as base64.
fn loadgen_json_result() -> Value {
    let template = Template {
        reply_to: "_INBOX.loadgen.bench".into(),
        refused_reply_to: "refused".into(),
        opaque_bytes: 256,
    };
    let request_id = RunIds::new("bench").request_id(Tag::Measured(4242));
    let bytes = payload::encode_json(&template, Kind::Trtllm, &request_id, 4242, 0);
    wire::decode(&bytes, Encoding::Json).expect("loadgen writes JSON")
}

/// [`loadgen_result`] with `tokens` prompt token IDs in its `request`, up to
/// 128,000 (a Llama 3 vocabulary: two- and four-byte integers).
fn long_prompt_result(tokens: u64) -> Value {
    let Value::Map(mut top) = loadgen_result() else {
        panic!("loadgen writes a map");
    };
    let Some(Value::Map(mut request)) = map::take(&mut top, "request") else {
        panic!("loadgen writes a request map");
    };
    let ids = (0..tokens).map(|i| Value::from(i * 7919 % 128_000));
    map::set(&mut request, "token_ids", Value::Array(ids.collect()));
    map::set(&mut top, "request", Value::Map(request));
    Value::Map(top)
}

/// A case's input bytes: its value encoded, and for a `_spaced_json` case
/// with a space after each `:` and `,` between tokens, as Python's
/// `json.dumps` writes by default.
fn payload(name: &str, value: &Value, encoding: Encoding) -> Vec<u8> {
    let bytes = wire::encode(value, encoding);
    if !name.ends_with("_spaced_json") {
        return bytes;
    }
    let (mut out, mut in_string, mut escaped) = (Vec::new(), false, false);
    for c in bytes {
        out.push(c);
        match c {
            _ if escaped => escaped = false,
            b'\\' if in_string => escaped = true,
            b'"' => in_string = !in_string,
            b':' | b',' if !in_string => out.push(b' '),
            _ => {}
        }
    }
    out
}

/// The default rules, but for a TensorRT-LLM handoff without
/// `disagg_request_id`, which the worker mints: the `*_minted_*` cases
/// measure the mint.
fn rules() -> Rules {
    let mut config = Config::default();
    config.trtllm.missing_disagg_request_id = MissingDisaggRequestId::Mint;
    config
        .resolve()
        .map(|c| Rules::from_config(&c).expect("rules"))
        .expect("default rules")
}

// The worker's allocator (src/main.rs): a decision allocates its output and
// a few strings, and what that costs depends on the allocator.
#[global_allocator]
static ALLOCATOR: prefill_handoff::alloc::MiMalloc = prefill_handoff::alloc::MiMalloc;

type DecideFn = fn(Input<'_>, &Rules, &mut dyn IdSource) -> Decision;

/// The benchmarked results: name, value, encoding.
fn cases() -> [(&'static str, Value, Encoding); 10] {
    [
        (
            "trtllm_decode_minted_msgpack",
            typical_result(Value::from("length"), None),
            Encoding::MsgPack,
        ),
        (
            "trtllm_decode_kept_msgpack",
            typical_result(Value::from("length"), Some(987_654_321)),
            Encoding::MsgPack,
        ),
        (
            "trtllm_terminal_eos_msgpack",
            typical_result(Value::from("eos"), None),
            Encoding::MsgPack,
        ),
        (
            "sglang_decode_msgpack",
            engine_result(json!({
                "bootstrap_host": "10.0.0.5", "bootstrap_port": 8998, "bootstrap_room": 1_234_567_u64,
            })),
            Encoding::MsgPack,
        ),
        (
            "vllm_decode_msgpack",
            engine_result(json!({
                "do_remote_prefill": true, "remote_engine_id": "engine-a",
                "remote_block_ids": (0..26).collect::<Vec<u32>>(),
                "remote_host": "10.0.0.6", "remote_port": 5600,
            })),
            Encoding::MsgPack,
        ),
        (
            // What `loadgen` sends, so that the worker's profile and this
            // one agree: token IDs up to 128,000 (two- and four-byte
            // integers) where the cases above have 0..64.
            "loadgen_trtllm_msgpack",
            loadgen_result(),
            Encoding::MsgPack,
        ),
        (
            // The same with a 2,048-token prompt in `request`, as a real
            // dispatcher passes it on: the pass-through request is validated
            // token by token, so its length sets most of the cost.
            "long_prompt_trtllm_msgpack",
            long_prompt_result(2048),
            Encoding::MsgPack,
        ),
        (
            // The same handoff from a JSON producer: what `loadgen
            // --json-results` sends, against `loadgen_trtllm_msgpack`.
            "loadgen_trtllm_json",
            loadgen_json_result(),
            Encoding::Json,
        ),
        (
            // The same as Python's `json.dumps` writes it by default:
            // `", "` and `": "` between tokens (see `payload`).
            "loadgen_trtllm_spaced_json",
            loadgen_json_result(),
            Encoding::Json,
        ),
        (
            "trtllm_decode_minted_json",
            // JSON has no binary: opaque_state becomes an array of numbers.
            typical_result(Value::from("length"), None),
            Encoding::Json,
        ),
    ]
}

/// Each case through `decide` (in place where it applies) and through
/// `decide_values` (value trees only, the path before the in-place one).
fn decisions(c: &mut Criterion) {
    let rules = rules();
    let slot = MachineId::new(17).expect("slot");
    let mut group = c.benchmark_group("decide");
    for (name, value, encoding) in cases() {
        let payload = payload(name, &value, encoding);
        let paths: [(&str, DecideFn); 2] = [("", decide), ("_values", decide_values)];
        for (suffix, decide_fn) in paths {
            let mut identity = Identity::fixed(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS, slot);
            group.throughput(Throughput::Elements(1));
            group.bench_function(format!("{name}_{}B{suffix}", payload.len()), |b| {
                b.iter(|| {
                    let input = Input {
                        payload: black_box(&payload),
                        encoding,
                        subject: "llm.prefill.results",
                        nats_reply: None,
                        deadline_header: None,
                        kv_expires_header: None,
                        now_ms: 0,
                        published_ms: 0,
                        cancels: prefill_handoff::decision::NO_CANCELS,
                    };
                    black_box(decide_fn(input, &rules, &mut identity))
                })
            });
        }
    }
    group.finish();
}

/// `DECIDE_ITERS=N [DECIDE_PATH=values] DECIDE_CASE=name`: no criterion, just
/// N decisions of one case, for instruction counts under
/// `valgrind --tool=callgrind` (stable on a noisy machine, unlike time).
fn count_instructions(iters: usize) {
    let rules = rules();
    let slot = MachineId::new(17).expect("slot");
    let wanted =
        std::env::var("DECIDE_CASE").unwrap_or_else(|_| "trtllm_decode_kept_msgpack".into());
    let decide_fn: DecideFn = match std::env::var("DECIDE_PATH").as_deref() {
        Ok("values") => decide_values,
        _ => decide,
    };
    let (name, value, encoding) = cases()
        .into_iter()
        .find(|(name, _, _)| *name == wanted)
        .expect("DECIDE_CASE names a case");
    let payload = payload(name, &value, encoding);
    let mut identity = Identity::fixed(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS, slot);
    for _ in 0..iters {
        let input = Input {
            payload: black_box(&payload),
            encoding,
            subject: "llm.prefill.results",
            nats_reply: None,
            deadline_header: None,
            kv_expires_header: None,
            now_ms: 0,
            published_ms: 0,
            cancels: prefill_handoff::decision::NO_CANCELS,
        };
        black_box(decide_fn(input, &rules, &mut identity));
    }
}

fn ids(c: &mut Criterion) {
    let slot = MachineId::new(1020).expect("slot");
    let mut group = c.benchmark_group("ids_per_slot");
    group.throughput(Throughput::Elements(1));
    for layout in [IdLayout::Rc21, IdLayout::Rc22] {
        // The generator on the wall clock, waiting when a millisecond's
        // counter is used up: the real ceiling per slot.
        let mut generator = IdGenerator::new(layout, slot);
        group.bench_function(format!("generator_{layout}"), |b| {
            b.iter(|| {
                black_box(generator.next_with(|| clock::since_epoch_ms(DEFAULT_EPOCH_UNIX_MS)))
            })
        });
        // The worker's path: the identity's lock, lease check and clock.
        let identity = Identity::fixed(layout, DEFAULT_EPOCH_UNIX_MS, slot);
        group.bench_function(format!("identity_{layout}"), |b| {
            b.iter(|| black_box(identity.mint_many(1).expect("a fixed identity mints")))
        });
        // The layout arithmetic alone.
        let mut counter = 0u16;
        group.bench_function(format!("encode_{layout}"), |b| {
            b.iter(|| {
                counter = (counter + 1) & layout.max_counter();
                black_box(layout.encode(black_box(60_000_000_000), slot, counter))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decisions, ids);

fn main() {
    if let Some(iters) = std::env::var("DECIDE_ITERS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        count_instructions(iters);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
