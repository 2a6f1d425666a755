//! The invariants every decision holds, whatever the input (contract 4.2 and
//! 4.3): exactly one output, on a subject it may use, with headers that can
//! stand in a NATS message. Shared by the hostile-input property tests and
//! the fuzz targets (fuzz/src/targets.rs), so both hold the decision to the
//! same rules.

use super::{DEAD, GEN, body, field, header, path};
use prefill_handoff::decision::{Backend, Decision, Outcome, Rules};
use prefill_handoff::wire::Encoding;
use rmpv::Value;

/// Panics, naming the broken rule, unless `d` is a valid decision for
/// `payload` in `encoding` under `rules`.
pub fn check(d: &Decision, payload: &[u8], encoding: Encoding, rules: &Rules) {
    for (name, value) in &d.headers {
        // async-nats panics on a header value holding CR or LF, and the
        // NATS protocol would read one as the end of the header line.
        assert!(!value.contains(['\r', '\n']), "{name}: {value:?}");
    }
    match &d.outcome {
        Outcome::DeadLetter { .. } => {
            assert_eq!(&*d.subject, DEAD);
            assert_eq!(d.payload, payload, "a dead letter is the original bytes");
            return;
        }
        Outcome::Decode { backend, minted } => {
            assert_eq!(&*d.subject, GEN);
            assert!(header(d, "Nats-Msg-Id").is_some_and(|id| id.starts_with("handoff-")));
            let job = body(d, encoding);
            let id = field(&job, "disagg_request_id").map(Value::as_u64);
            if *backend == Backend::Trtllm {
                let id = id.flatten().expect("a TensorRT-LLM job has an ID");
                assert!((1..(1 << 63) - 1).contains(&id));
                assert_eq!(
                    path(&job, &["handoff", "request_type"]).and_then(Value::as_str),
                    Some("generation_only")
                );
            } else {
                assert_eq!(id, None);
                assert!(!minted);
            }
            assert!(
                field(&job, "prefill_output")
                    .and_then(|o| field(o, "disaggregated_params"))
                    .is_none()
            );
        }
        Outcome::Terminal { .. } | Outcome::Error { .. } => {
            assert!(
                rules.reply_policy.check(&d.subject).is_ok(),
                "answered on a refused subject {:?}",
                d.subject
            );
            let answer = body(d, encoding);
            assert_eq!(
                field(&answer, "kind").and_then(Value::as_str),
                Some(d.outcome.kind())
            );
            assert!(
                field(&answer, "output")
                    .and_then(|o| field(o, "disaggregated_params"))
                    .is_none()
            );
        }
    }
    if encoding == Encoding::Json {
        assert_eq!(header(d, "Content-Type"), Some("application/json"));
    }
}
