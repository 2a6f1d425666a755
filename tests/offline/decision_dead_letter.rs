//! Dead letters and reply subjects (contract 4.2, last paragraphs): input with
//! no usable, allowed reply subject goes to the dead-letter subject with its
//! original bytes, and a crafted `reply_to` never makes the worker publish
//! outside the allowed patterns.

use crate::decision_support;

use decision_support::*;
use prefill_handoff::config::Config;
use prefill_handoff::decision::{DeadLetterCode, ErrorCode, Outcome, Refusal, Rules};
use prefill_handoff::wire::Encoding;
use rmpv::Value;
use serde_json::{Value as Json, json};

fn good() -> Json {
    result(json!([frame(Some(json!("eos")), None)]))
}

/// `depth` nested single-element arrays around `inner`, as MessagePack.
fn nested_arrays(depth: usize) -> Vec<u8> {
    let mut out = vec![0x91; depth];
    out.push(0x01);
    out
}

#[test]
fn undecodable_input_is_dead_lettered_with_its_original_bytes() {
    let good_bytes = msgpack(&v(good()));
    let truncated = good_bytes[..good_bytes.len() - 3].to_vec();
    let mut trailing = good_bytes.clone();
    trailing.push(0xc0);
    // A map around 100 nested arrays: deeper than the 64 levels accepted.
    let mut too_deep = vec![0x81, 0xa1, b'x'];
    too_deep.extend(nested_arrays(100));
    let rows: Vec<(&str, Vec<u8>)> = vec![
        ("empty body", vec![]),
        ("never-used marker 0xc1", vec![0xc1]),
        ("random bytes", vec![0xde, 0xad, 0xbe, 0xef]),
        ("truncated map", truncated),
        ("trailing bytes", trailing),
        ("too deep nesting", too_deep),
        ("an array, not a map", msgpack(&v(json!([good()])))),
        ("a string, not a map", msgpack(&v(json!("hello")))),
        ("an integer, not a map", msgpack(&v(json!(5)))),
        ("nil", vec![0xc0]),
        (
            "reply_to an integer",
            msgpack(&v(with(good(), "reply_to", json!(7)))),
        ),
        (
            "reply_to a map",
            msgpack(&v(with(good(), "reply_to", json!({"s": REPLY})))),
        ),
        (
            "JSON sent as MessagePack",
            serde_json::to_vec(&good()).expect("json"),
        ),
    ];
    for (name, bytes) in rows {
        let d = decide_bytes(&bytes, Encoding::MsgPack, &rules(), Some("_INBOX.fallback"));
        check(name, &d, Expect::Dead(DeadLetterCode::Malformed));
        assert_eq!(d.payload, bytes, "{name}: the original bytes, unchanged");
        assert_eq!(d.request_id, None);
        assert_eq!(header(&d, "Content-Type"), None);
    }
}

#[test]
fn malformed_json_is_dead_lettered_and_keeps_its_content_type() {
    let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    let deeper = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let rows: Vec<(&str, Vec<u8>)> = vec![
        ("not JSON", b"{request_id: 1".to_vec()),
        (
            "truncated",
            br#"{"request_id": "r", "reply_to": "_INBOX.a""#.to_vec(),
        ),
        (
            "trailing garbage",
            br#"{"reply_to": "_INBOX.a"} x"#.to_vec(),
        ),
        ("array", br#"[{"reply_to": "_INBOX.a"}]"#.to_vec()),
        (
            "too deep for the worker",
            format!(r#"{{"reply_to": "_INBOX.a", "x": {deep}}}"#).into_bytes(),
        ),
        (
            "too deep for serde_json",
            format!(r#"{{"reply_to": "_INBOX.a", "x": {deeper}}}"#).into_bytes(),
        ),
        ("MessagePack sent as JSON", msgpack(&v(good()))),
        ("invalid UTF-8", b"{\"reply_to\": \"_INBOX.\xff\"}".to_vec()),
    ];
    for (name, bytes) in rows {
        let d = decide_bytes(&bytes, Encoding::Json, &rules(), None);
        check(name, &d, Expect::Dead(DeadLetterCode::Malformed));
        assert_eq!(d.payload, bytes);
        assert_eq!(
            header(&d, "Content-Type"),
            Some("application/json"),
            "{name}"
        );
    }
}

#[test]
fn nesting_up_to_64_levels_is_accepted_in_both_encodings() {
    for (levels, ok) in [(63, true), (64, true), (65, false)] {
        // The top-level map is level 1; `x` holds the other levels.
        let inner = levels - 1;
        let mut mp = msgpack(&v(good()));
        mp[0] += 1; // one more entry in the top-level fixmap
        mp.extend([0xa1, b'x']);
        mp.extend(nested_arrays(inner));
        let d = decide_bytes(&mp, Encoding::MsgPack, &rules(), None);
        assert_eq!(
            d.outcome.kind() == "terminal",
            ok,
            "msgpack {levels}: {:?}",
            d.detail
        );

        // With an empty innermost array, and with a string leaf.
        let mut mp = msgpack(&v(good()));
        mp[0] += 1;
        mp.extend([0xa1, b'x']);
        mp.extend(vec![0x91; inner.saturating_sub(1)]);
        mp.push(0x90);
        let d = decide_bytes(&mp, Encoding::MsgPack, &rules(), None);
        assert_eq!(d.outcome.kind() == "terminal", ok, "msgpack empty {levels}");
        let mut mp = msgpack(&v(good()));
        mp[0] += 1;
        mp.extend([0xa1, b'x']);
        mp.extend(vec![0x91; inner]);
        mp.extend([0xa2, b'h', b'i']);
        let d = decide_bytes(&mp, Encoding::MsgPack, &rules(), None);
        assert_eq!(
            d.outcome.kind() == "terminal",
            ok,
            "msgpack string {levels}"
        );

        let mut json = serde_json::to_string(&good()).expect("json");
        json.pop();
        json.push_str(&format!(
            r#","x":{}"s"{}}}"#,
            "[".repeat(inner),
            "]".repeat(inner)
        ));
        let d = decide_bytes(json.as_bytes(), Encoding::Json, &rules(), None);
        assert_eq!(
            d.outcome.kind() == "terminal",
            ok,
            "json {levels}: {:?}",
            d.detail
        );
    }
}

#[test]
fn too_large_is_checked_before_anything_else() {
    let mut rules = rules();
    rules.max_payload_bytes = 64;
    let big = msgpack(&v(with(good(), "padding", json!("x".repeat(100)))));
    let d = decide_bytes(&big, Encoding::MsgPack, &rules, Some(REPLY));
    check(
        "over max_payload_bytes",
        &d,
        Expect::Dead(DeadLetterCode::TooLarge),
    );
    assert_eq!(d.payload, big);
    let garbage = vec![0xc1; 65];
    let d = decide_bytes(&garbage, Encoding::MsgPack, &rules, None);
    check(
        "garbage over the limit",
        &d,
        Expect::Dead(DeadLetterCode::TooLarge),
    );
    let exactly = vec![0xc1; 64];
    let d = decide_bytes(&exactly, Encoding::MsgPack, &rules, None);
    check("at the limit", &d, Expect::Dead(DeadLetterCode::Malformed));
    // The default limit is 1 MiB.
    assert_eq!(decision_support::rules().max_payload_bytes, 1 << 20);
}

#[test]
fn reply_subjects_outside_the_allowed_patterns_are_refused() {
    let refused = [
        "$JS.API.STREAM.DELETE.X",
        "$JS.API.CONSUMER.DELETE.LLM_PREFILL.handoff",
        "$SYS.REQ.SERVER.PING",
        "$KV.x",
        "$KV.bucket.key",
        "$O.store.x",
        "_INBOX.*",
        "_INBOX.>",
        "_INBOX.a.*",
        ">",
        "*",
        GEN,
        DEAD,
        SOURCE,
        "llm.handoff.ids",
        "_INBOX.a\r\nPUB llm.gen.jobs 2\r\nhi",
        "_INBOX.a\nb",
        "_INBOX.a b",
        "_INBOX..a",
        "_INBOX.a.",
        "_INBOX",
        "llm.replies",
        "other.replies.x",
        "",
    ];
    for subject in refused {
        let d = decide_json_as_msgpack(with(good(), "reply_to", json!(subject)));
        check(subject, &d, Expect::Dead(DeadLetterCode::ReplyToNotAllowed));
        for (_, value) in &d.headers {
            assert!(!value.contains(['\r', '\n']), "header value {value:?}");
        }
    }
    let long = format!("_INBOX.{}", "a".repeat(600));
    let d = decide_json_as_msgpack(with(good(), "reply_to", json!(long)));
    check(
        "600 bytes",
        &d,
        Expect::Dead(DeadLetterCode::ReplyToNotAllowed),
    );

    for allowed in [
        "_INBOX.abc",
        "_INBOX.abc.def",
        "llm.replies.client-7",
        "llm.replies.a.b",
    ] {
        let d = decide_json_as_msgpack(with(good(), "reply_to", json!(allowed)));
        assert_eq!(&*d.subject, allowed);
        assert_eq!(d.outcome.kind(), "terminal");
    }
}

#[test]
fn a_refused_nats_reply_subject_is_refused_too() {
    let bytes = msgpack(&v(without(good(), "reply_to")));
    for subject in ["$JS.API.STREAM.DELETE.X", "_INBOX.*", GEN] {
        let d = decide_bytes(&bytes, Encoding::MsgPack, &rules(), Some(subject));
        check(subject, &d, Expect::Dead(DeadLetterCode::ReplyToNotAllowed));
    }
}

#[test]
fn reply_to_given_twice_is_malformed() {
    let k = Value::from;
    let m = Value::Map(vec![
        (k("request_id"), k("req-1")),
        (k("reply_to"), k(REPLY)),
        (k("reply_to"), k("_INBOX.other")),
        (k("frames"), Value::Array(vec![])),
    ]);
    check(
        "twice",
        &decide_msgpack(&m),
        Expect::Dead(DeadLetterCode::Malformed),
    );
}

#[test]
fn core_mode_falls_back_to_the_nats_reply_subject_and_jetstream_does_not() {
    let no_reply_to = msgpack(&v(without(good(), "reply_to")));
    let null_reply_to = msgpack(&v(with(good(), "reply_to", Json::Null)));
    for bytes in [&no_reply_to, &null_reply_to] {
        // Core mode, with a NATS reply subject: answered there.
        let d = decide_bytes(bytes, Encoding::MsgPack, &rules(), Some("_INBOX.nats.7"));
        assert_eq!(d.outcome.kind(), "terminal");
        assert_eq!(&*d.subject, "_INBOX.nats.7");
        // Core mode, without one: nowhere to answer.
        let d = decide_bytes(bytes, Encoding::MsgPack, &rules(), None);
        check(
            "core, none",
            &d,
            Expect::Dead(DeadLetterCode::MissingReplyTo),
        );
        // JetStream mode: the NATS reply subject is the ack subject, never a reply.
        let d = decide_bytes(
            bytes,
            Encoding::MsgPack,
            &jetstream_rules(),
            Some("$JS.ACK.LLM_PREFILL.handoff.1.2.3.4.5"),
        );
        check(
            "jetstream",
            &d,
            Expect::Dead(DeadLetterCode::MissingReplyTo),
        );
        let d = decide_bytes(
            bytes,
            Encoding::MsgPack,
            &jetstream_rules(),
            Some("_INBOX.x"),
        );
        check(
            "jetstream, inbox",
            &d,
            Expect::Dead(DeadLetterCode::MissingReplyTo),
        );
    }
    // The body's reply_to wins over the NATS reply subject in either mode.
    let bytes = msgpack(&v(good()));
    for rules in [rules(), jetstream_rules()] {
        let d = decide_bytes(&bytes, Encoding::MsgPack, &rules, Some("_INBOX.nats.7"));
        assert_eq!(&*d.subject, REPLY);
    }
    // The fallback subject is what a decode job carries as reply_to.
    let decode = msgpack(&v(without(needs_decode(sglang()), "reply_to")));
    let d = decide_bytes(&decode, Encoding::MsgPack, &rules(), Some("_INBOX.nats.8"));
    assert_eq!(&*d.subject, GEN);
    let b = body(&d, Encoding::MsgPack);
    assert_eq!(
        field(&b, "reply_to").and_then(Value::as_str),
        Some("_INBOX.nats.8")
    );
}

#[test]
fn an_allowed_reply_subject_turns_problems_into_error_responses() {
    // With a good reply subject, a broken body is an error to the client, not
    // a dead letter.
    let d = decide_json_as_msgpack(json!({"reply_to": REPLY, "frames": "x"}));
    assert_eq!(
        d.outcome,
        Outcome::Error {
            code: ErrorCode::Malformed
        }
    );
    assert_eq!(&*d.subject, REPLY);
}

#[test]
fn dead_letter_headers_are_safe_and_name_the_source() {
    let d = decide_bytes(&[0xc1], Encoding::MsgPack, &rules(), None);
    let why = header(&d, "Handoff-Error").unwrap_or_default();
    assert!(why.contains("MessagePack"), "{why}");
    let evil = format!("{}\r\nX: y", "_INBOX.".repeat(300));
    let d = decide_json_as_msgpack(with(good(), "reply_to", json!(evil)));
    for (name, value) in &d.headers {
        assert!(!value.contains(['\r', '\n']), "{name}: {value:?}");
        assert!(value.len() <= 1100, "{name} is bounded");
    }
}

/// Contract 4.2 and 9: the worker's own subjects are never a reply subject,
/// even when `allowed_reply_subjects` allows everything (`>`). The rules come
/// from the configuration, as `run` builds them, so a subject dropped from
/// `Config::own_subjects` (or from the check) fails its row. One row per own
/// subject: each prefill subject, a subject under a prefill wildcard, GEN,
/// dead letter and the ID service.
#[test]
fn own_subjects_are_refused_even_when_every_reply_subject_is_allowed() {
    let overrides = [
        ("allowed_reply_subjects", ">"),
        (
            "subjects.prefill_results",
            "llm.prefill.results,llm.prefill.other,llm.prefill.more.>",
        ),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let config = Config::load_from(None, &[], &overrides).expect("the configuration is valid");
    let rules = Rules::from_config(&config).expect("rules");
    let rows: &[(&str, &str)] = &[
        ("first prefill subject", "llm.prefill.results"),
        ("second prefill subject", "llm.prefill.other"),
        ("under the prefill wildcard", "llm.prefill.more.x"),
        ("deeper under the prefill wildcard", "llm.prefill.more.x.y"),
        ("GEN", "llm.gen.jobs"),
        ("dead letter", "llm.handoff.dead"),
        ("ID service", "llm.handoff.ids"),
    ];
    for (name, subject) in rows {
        assert_eq!(
            rules.reply_policy.check(subject),
            Err(Refusal::OwnSubject(subject.to_string())),
            "{name}"
        );
        let d = decide_bytes(
            &msgpack(&v(with(good(), "reply_to", json!(subject)))),
            Encoding::MsgPack,
            &rules,
            None,
        );
        check(name, &d, Expect::Dead(DeadLetterCode::ReplyToNotAllowed));
    }
    // The allowlist itself is in force: anything else goes.
    for subject in ["llm.prefill", "llm.gen.jobs.x", "llm.handoff.other", "x"] {
        assert_eq!(rules.reply_policy.check(subject), Ok(()), "{subject}");
    }
}

/// The headers the patched async-nats hands over for an `HMSG` whose header
/// block it cannot parse: its marker alone, saying why
/// (vendor/patches/0002; the client's side is tested against a fake server
/// in tests/server/nats_parser.rs).
fn marked(why: &str) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    let why = async_nats::HeaderValue::from_lossy(why);
    headers.insert(async_nats::header::HEADER_BLOCK_ERROR, why);
    headers
}

#[test]
fn a_header_block_the_client_cannot_parse_is_a_malformed_dead_letter() {
    // A valid result that would otherwise be a decode job needing a mint.
    let payload = msgpack(&v(needs_decode(trt())));
    let input = input(&payload, Encoding::MsgPack);
    let rows = [
        (
            "a line break in a header value",
            "a header line has no colon",
        ),
        (
            "the client's marker header, forged by the publisher",
            "header name \"Async-Nats-Header-Block-Error\" is reserved by the client",
        ),
    ];
    for (name, what) in rows {
        let headers = marked(what);
        let mut ids = TestIds::holding_slot();
        let d = prefill_handoff::pipeline::decide::decide_received_inline(
            input,
            Some(&headers),
            &rules(),
            &mut ids,
        );
        assert_eq!(
            d.outcome,
            Outcome::DeadLetter {
                code: DeadLetterCode::Malformed
            },
            "{name}"
        );
        assert_eq!(&*d.subject, DEAD, "{name}");
        assert_eq!(d.payload, payload, "{name}: the input's bytes as they came");
        assert_eq!(ids.minted, 0, "{name}: nothing minted");
        let why = header(&d, "Handoff-Error").unwrap_or_default();
        assert!(
            why.starts_with("the message's NATS header block could not be parsed: ")
                && why.contains(what),
            "{name}: {why:?}"
        );
    }

    // A header block that parses leaves the decision to the body.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        "traceparent",
        async_nats::HeaderValue::from_lossy("00-ab-01"),
    );
    let mut ids = TestIds::holding_slot();
    let d = prefill_handoff::pipeline::decide::decide_received_inline(
        input,
        Some(&headers),
        &rules(),
        &mut ids,
    );
    assert!(
        matches!(d.outcome, Outcome::Decode { .. }),
        "{:?}",
        d.outcome
    );
}
