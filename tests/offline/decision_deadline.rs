//! Deadlines and cancellation at the handoff (contract 10), one row per rule:
//! which deadline counts, what is refused and with which code, what the KV
//! release notice holds, and what the decode job carries.

use crate::decision_support;

use decision_support::*;
use prefill_handoff::decision::{
    Backend, Cancelled, Cancels, Decision, ErrorCode, Input, NO_CANCELS, Outcome, decide,
    decide_in_place, decide_values,
};
use prefill_handoff::wire::{self, Encoding};
use rmpv::Value;
use serde_json::{Value as Json, json};

/// The time of every decision here, Unix ms.
const NOW: u64 = 1_767_225_600_000;
const PAST: u64 = NOW - 1;
const FUTURE: u64 = NOW + 30_000;

/// The request IDs given, cancelled (with a reason when one is given).
struct Set(&'static [(&'static str, Option<&'static str>)]);

impl Cancels for Set {
    fn lookup(&self, request_id: &str, _: u64) -> Option<Cancelled> {
        self.0
            .iter()
            .find(|(id, _)| *id == request_id)
            .map(|(_, reason)| Cancelled {
                reason: reason.map(str::to_string),
            })
    }
}

const REQ_1_CANCELLED: &Set = &Set(&[("req-1", Some("client disconnected"))]);

/// One decision at [`NOW`], checked to be the same by the in-place path
/// (when it answers) and the value-tree path.
fn at(
    message: &Json,
    encoding: Encoding,
    header: Option<&str>,
    cancels: &dyn Cancels,
    ids: &mut TestIds,
) -> Decision {
    let payload = match encoding {
        Encoding::MsgPack => msgpack(&v(message.clone())),
        Encoding::Json => serde_json::to_vec(message).unwrap(),
    };
    let input = input_at(&payload, encoding, header, cancels);
    let reference = decide_values(input, &rules(), &mut ids.clone());
    let d = decide(input, &rules(), ids);
    assert_eq!(d, reference, "both paths decide alike");
    d
}

/// A result's input at [`NOW`] on [`SOURCE`], with no NATS reply subject.
fn input_at<'a>(
    payload: &'a [u8],
    encoding: Encoding,
    header: Option<&'a str>,
    cancels: &'a dyn Cancels,
) -> Input<'a> {
    Input {
        deadline_header: header,
        now_ms: NOW,
        published_ms: NOW,
        cancels,
        ..input(payload, encoding)
    }
}

fn msgpack_at(message: &Json, header: Option<&str>, cancels: &dyn Cancels) -> Decision {
    at(
        message,
        Encoding::MsgPack,
        header,
        cancels,
        &mut TestIds::holding_slot(),
    )
}

fn json_of(d: &Decision) -> Json {
    wire::to_json(&body(d, Encoding::MsgPack))
}

fn code(d: &Decision) -> Option<ErrorCode> {
    match d.outcome {
        Outcome::Error { code } => Some(code),
        _ => None,
    }
}

#[test]
fn the_earlier_deadline_counts_and_a_passed_one_refuses_the_handoff() {
    let trt_result = || needs_decode(trt());
    // (name, body deadline_ms, header, expected code; None: a decode job)
    type Row<'a> = (&'a str, Option<Json>, Option<&'a str>, Option<ErrorCode>);
    let rows: [Row; 12] = [
        ("none", None, None, None),
        ("null field", Some(Json::Null), None, None),
        ("body future", Some(json!(FUTURE)), None, None),
        (
            "body now",
            Some(json!(NOW)),
            None,
            Some(ErrorCode::DeadlineExceeded),
        ),
        (
            "body past",
            Some(json!(PAST)),
            None,
            Some(ErrorCode::DeadlineExceeded),
        ),
        (
            "body 0",
            Some(json!(0)),
            None,
            Some(ErrorCode::DeadlineExceeded),
        ),
        ("header future", None, Some("1767225630000"), None),
        (
            "header past",
            None,
            Some("1767225599999"),
            Some(ErrorCode::DeadlineExceeded),
        ),
        (
            "body past, header future",
            Some(json!(PAST)),
            Some("1767225630000"),
            Some(ErrorCode::DeadlineExceeded),
        ),
        (
            "body future, header past",
            Some(json!(FUTURE)),
            Some("1767225599999"),
            Some(ErrorCode::DeadlineExceeded),
        ),
        (
            "both future",
            Some(json!(FUTURE)),
            Some("1767225640000"),
            None,
        ),
        (
            "null field, header future",
            Some(Json::Null),
            Some("1767225630000"),
            None,
        ),
    ];
    for (name, field, header, want) in rows {
        let mut message = trt_result();
        if let Some(ms) = field {
            message["deadline_ms"] = ms;
        }
        let d = msgpack_at(&message, header, NO_CANCELS);
        assert_eq!(code(&d), want, "{name}: {:?}", d.detail);
        if want.is_some() {
            check(name, &d, Expect::Error(ErrorCode::DeadlineExceeded));
            assert!(d.release.is_some(), "{name}: a release notice");
        } else {
            check(name, &d, Expect::Decode(Backend::Trtllm));
            assert!(d.release.is_none(), "{name}: no release notice");
        }
    }
}

#[test]
fn a_decode_job_carries_the_effective_deadline_in_its_field_and_header() {
    let mut message = needs_decode(sglang());
    message["deadline_ms"] = json!(FUTURE + 10);
    message["model"] = json!("m");
    let d = msgpack_at(&message, Some("1767225630000"), NO_CANCELS);
    check("job", &d, Expect::Decode(Backend::Sglang));
    assert_eq!(d.deadline_ms, Some(FUTURE));
    assert_eq!(header(&d, "Handoff-Deadline"), Some("1767225630000"));
    assert_eq!(header(&d, "Nats-Msg-Id"), Some("handoff-req-1"));
    let job = body(&d, Encoding::MsgPack);
    let Value::Map(entries) = &job else {
        panic!("a job is a map")
    };
    let deadlines: Vec<&Value> = entries
        .iter()
        .filter(|(k, _)| k.as_str() == Some("deadline_ms"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(deadlines, [&Value::from(FUTURE)], "once, the effective one");
    assert_eq!(field(&job, "model").and_then(Value::as_str), Some("m"));

    // Without a deadline: neither.
    let d = msgpack_at(&needs_decode(sglang()), None, NO_CANCELS);
    assert_eq!(d.deadline_ms, None);
    assert_eq!(header(&d, "Handoff-Deadline"), None);
    assert!(field(&body(&d, Encoding::MsgPack), "deadline_ms").is_none());
}

#[test]
fn terminal_and_error_results_are_answered_as_before_whatever_their_deadline() {
    let past = |mut m: Json| {
        m["deadline_ms"] = json!(PAST);
        m
    };
    let terminal = past(result(json!([frame(Some(json!("stop")), Some(trt()))])));
    let d = msgpack_at(&terminal, None, REQ_1_CANCELLED);
    check(
        "terminal",
        &d,
        Expect::Terminal(prefill_handoff::decision::FinishReason::Stop),
    );
    assert!(d.release.is_none());

    let mut failed = frame(None, None);
    failed["error"] = json!("CUDA error");
    let d = msgpack_at(&past(result(json!([failed]))), None, REQ_1_CANCELLED);
    assert_eq!(code(&d), Some(ErrorCode::PrefillFailed));
    assert!(d.release.is_none());

    // A handoff that fails validation is answered for that, with no notice.
    let bad = past(needs_decode(with(sglang(), "bootstrap_port", json!(0))));
    let d = msgpack_at(&bad, None, REQ_1_CANCELLED);
    assert_eq!(code(&d), Some(ErrorCode::InvalidBootstrap));
    assert!(d.release.is_none());
    let d = msgpack_at(
        &past(needs_decode(without(trt(), "ctx_request_id"))),
        None,
        NO_CANCELS,
    );
    assert_eq!(code(&d), Some(ErrorCode::MissingCtxRequestId));
    assert!(d.release.is_none());
}

#[test]
fn a_deadline_that_is_not_an_integer_in_range_is_invalid() {
    let rows: [(&str, Option<Json>, Option<&str>); 9] = [
        ("float", Some(json!(1.5)), None),
        ("whole float", Some(json!(1_767_225_630_000.0)), None),
        ("string", Some(json!("1767225630000")), None),
        ("negative", Some(json!(-1)), None),
        ("2^63", Some(json!(1u64 << 63)), None),
        ("bool", Some(json!(true)), None),
        ("header words", None, Some("tomorrow")),
        ("header float", None, Some("1767225630000.5")),
        ("valid field, bad header", Some(json!(FUTURE)), Some("-5")),
    ];
    for (name, field, header) in rows {
        for base in [
            needs_decode(trt()),
            result(json!([frame(Some(json!("stop")), None)])),
        ] {
            let mut message = base;
            if let Some(ms) = field.clone() {
                message["deadline_ms"] = ms;
            }
            let d = msgpack_at(&message, header, NO_CANCELS);
            check(name, &d, Expect::Error(ErrorCode::InvalidDeadline));
            assert!(d.release.is_none(), "{name}");
            let b = json_of(&d);
            let said = b["error"]["message"].as_str().unwrap();
            let culprit = if name.contains("header") {
                "Handoff-Deadline"
            } else {
                "deadline_ms"
            };
            assert!(said.contains(culprit), "{name}: {said}");
        }
    }
    // JSON: a number with a fraction is a float too.
    let mut message = needs_decode(trt());
    message["deadline_ms"] = json!(1.0);
    let d = at(
        &message,
        Encoding::Json,
        None,
        NO_CANCELS,
        &mut TestIds::holding_slot(),
    );
    assert_eq!(code(&d), Some(ErrorCode::InvalidDeadline));
}

#[test]
fn the_clock_skew_allowance_moves_the_line() {
    let mut message = needs_decode(vllm());
    message["deadline_ms"] = json!(NOW - 500);
    for (skew, want) in [(0, true), (500, true), (501, false), (10_000, false)] {
        let mut rules = rules();
        rules.deadline_skew_ms = skew;
        let payload = msgpack(&v(message.clone()));
        let input = input_at(&payload, Encoding::MsgPack, None, NO_CANCELS);
        let d = decide(input, &rules, &mut TestIds::holding_slot());
        assert_eq!(
            code(&d) == Some(ErrorCode::DeadlineExceeded),
            want,
            "skew {skew}"
        );
        assert_eq!(
            d,
            decide_values(input, &rules, &mut TestIds::holding_slot())
        );
    }
}

#[test]
fn a_cancelled_request_is_refused_with_a_notice_naming_its_backend_and_params() {
    let worker = json!({"instance_id": "00000000000000ab", "machine_id": 17});
    for (params, backend) in [
        (trt(), "trtllm"),
        (with(trt(), "disagg_request_id", json!(99)), "trtllm"),
        (sglang(), "sglang"),
        (vllm(), "vllm"),
        (json!({"engine": "x", "blocks": [1]}), "opaque"),
    ] {
        for encoding in [Encoding::MsgPack, Encoding::Json] {
            let message = needs_decode(params.clone());
            let mut ids = TestIds::holding_slot();
            let d = at(&message, encoding, None, REQ_1_CANCELLED, &mut ids);
            assert_eq!(code(&d), Some(ErrorCode::Cancelled), "{backend}");
            assert_eq!(ids.minted, 0, "{backend}: no ID spent on a refused handoff");
            let said = wire::to_json(&body(&d, encoding));
            assert_eq!(
                said["error"]["message"],
                "the request was cancelled (client disconnected); no decode job was sent"
            );
            let release = d.release.as_ref().expect("a release notice");
            assert_eq!(&*release.subject, "llm.kv.release");
            assert_eq!(release.headers.get("Nats-Msg-Id"), Some("release-req-1"));
            assert_eq!(
                release.headers.get("Content-Type"),
                (encoding == Encoding::Json).then_some("application/json"),
                "encoded like the input"
            );
            let notice = wire::to_json(&wire::decode(&release.payload, encoding).unwrap());
            assert_eq!(
                notice,
                json!({
                    "request_id": "req-1",
                    "reason": "cancelled",
                    "backend": backend,
                    "handoff": params,
                    "worker": worker,
                }),
                "{backend}: the params as received"
            );
        }
    }
}

#[test]
fn a_cancel_names_one_request_and_wins_over_a_passed_deadline() {
    let mut other = needs_decode(trt());
    other["request_id"] = json!("req-2");
    let d = msgpack_at(&other, None, REQ_1_CANCELLED);
    assert!(
        matches!(d.outcome, Outcome::Decode { .. }),
        "another request is unaffected"
    );

    let mut both = needs_decode(trt());
    both["deadline_ms"] = json!(PAST);
    let d = msgpack_at(&both, None, REQ_1_CANCELLED);
    assert_eq!(code(&d), Some(ErrorCode::Cancelled));
    let notice = &d.release.expect("a notice").payload;
    let notice = wire::to_json(&wire::decode(notice, Encoding::MsgPack).unwrap());
    assert_eq!(notice["reason"], "cancelled");

    // Without a reason, and the deadline's own notice.
    let d = msgpack_at(&needs_decode(trt()), None, &Set(&[("req-1", None)]));
    assert_eq!(
        json_of(&d)["error"]["message"],
        "the request was cancelled; no decode job was sent"
    );
    let d = msgpack_at(&both, None, NO_CANCELS);
    let notice = &d.release.expect("a notice").payload;
    let notice = wire::to_json(&wire::decode(notice, Encoding::MsgPack).unwrap());
    assert_eq!(notice["reason"], "deadline_exceeded");
}

#[test]
fn a_refusal_needs_no_slot_to_mint_with() {
    let mut message = needs_decode(trt());
    message["deadline_ms"] = json!(PAST);
    let d = at(
        &message,
        Encoding::MsgPack,
        None,
        NO_CANCELS,
        &mut TestIds::fenced(),
    );
    assert_eq!(code(&d), Some(ErrorCode::DeadlineExceeded));
    let notice = d.release.expect("a notice");
    let notice = wire::to_json(&wire::decode(&notice.payload, Encoding::MsgPack).unwrap());
    assert_eq!(notice["worker"]["machine_id"], Json::Null);
    let d = at(
        &needs_decode(trt()),
        Encoding::MsgPack,
        None,
        REQ_1_CANCELLED,
        &mut TestIds::fenced(),
    );
    assert_eq!(code(&d), Some(ErrorCode::Cancelled));
}

#[test]
fn common_refusals_and_jobs_with_deadlines_are_decided_in_place() {
    let mut future = needs_decode(without(trt(), "disagg_request_id"));
    future["deadline_ms"] = json!(FUTURE);
    let mut past = future.clone();
    past["deadline_ms"] = json!(PAST);
    for (message, cancels, header, kind) in [
        (&future, NO_CANCELS, None, "decode"),
        (&future, NO_CANCELS, Some("1767225630000"), "decode"),
        (&past, NO_CANCELS, None, "error"),
        (&future, REQ_1_CANCELLED as &dyn Cancels, None, "error"),
        (&future, NO_CANCELS, Some("1767225599999"), "error"),
    ] {
        let payload = msgpack(&v(message.clone()));
        let input = input_at(&payload, Encoding::MsgPack, header, cancels);
        let d = decide_in_place(input, &rules(), &mut TestIds::holding_slot())
            .unwrap_or_else(|| panic!("decided in place: {kind} {header:?}"));
        assert_eq!(d.outcome.kind(), kind);
        assert_eq!(
            d,
            decide_values(input, &rules(), &mut TestIds::holding_slot())
        );
    }
}
