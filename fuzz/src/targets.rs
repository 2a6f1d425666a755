//! One function per fuzz target: the input bytes in, a panic when a property
//! breaks. Used by the libFuzzer binaries (fuzz/fuzz_targets/) and replayed
//! over the seed corpus by the normal test suite (tests/offline/fuzz_corpus.rs).

use crate::decision_support::{SOURCE, TestIds, invariants, jetstream_rules, rules};
use async_nats::{HeaderMap, HeaderName, HeaderValue};

use prefill_handoff::decision::{Decision, Input, Rules, decide, decide_values};
use prefill_handoff::headers::names::{CONTENT_TYPE, HANDOFF_DEADLINE};
use prefill_handoff::headers::{
    self, MAX_TRACESTATE_BYTES, TRACEPARENT_LEN, TraceHeader, TraceHeaders,
};
use prefill_handoff::pipeline::decide::decide_received_inline;
use prefill_handoff::wire::{self, Encoding, MAX_DEPTH, scan};
use rmpv::Value;
use std::sync::LazyLock;

/// The MessagePack reader ([`wire::decode`]) and the zero-copy scanner
/// ([`scan`]) on arbitrary bytes:
/// - neither panics, and the scanner's accessors never panic on any span;
/// - what the reader accepts nests at most [`MAX_DEPTH`] deep, and writing
///   it gives bytes the reader reads back to the same bytes, in the
///   scanner's canonical form;
/// - the walk over any encoding ([`scan::any_end`]) ends one value at the
///   body's end exactly when the reader reads it;
/// - the scanner accepts only what the reader accepts, and for what it
///   accepts, decoding and encoding again gives the input byte for byte
///   (the promise the in-place decision splices outputs on);
/// - every value also renders as JSON that parses.
pub fn wire_msgpack(data: &[u8]) {
    let canonical = scan::validate(data);
    // The accessors on unvalidated bytes: `None` at worst.
    let _ = (scan::str_bytes(data), scan::uint(data), scan::is_nil(data));
    let _ = scan::entries(data).map(|(_, spans)| spans.count());
    let _ = scan::items(data).map(|(_, spans)| spans.count());
    let walked = scan::any_end(data, 0, 0, &mut { usize::MAX }) == Ok(data.len());

    let value = match wire::decode(data, Encoding::MsgPack) {
        Ok(value) => value,
        Err(_) => {
            assert!(!canonical, "the scanner accepted bytes the reader refuses");
            assert!(!walked, "the walk ended a value the reader refuses");
            return;
        }
    };
    assert!(walked, "the walk did not end the value the reader read");
    assert!(
        wire::depth(&value) <= MAX_DEPTH,
        "read past the depth limit"
    );
    let written = wire::encode(&value, Encoding::MsgPack);
    let reread = wire::decode(&written, Encoding::MsgPack)
        .unwrap_or_else(|e| panic!("the reader refuses the writer's output: {e}"));
    assert_eq!(
        wire::encode(&reread, Encoding::MsgPack),
        written,
        "writing what was read back changes it"
    );
    assert!(
        scan::validate(&written),
        "the writer's output is not in the scanner's canonical form"
    );
    if canonical {
        assert_eq!(
            written, data,
            "a canonical body does not re-encode to itself"
        );
        walk(data, &value);
    }
    let json = wire::encode(&value, Encoding::Json);
    assert!(
        serde_json::from_slice::<serde_json::Value>(&json).is_ok(),
        "the JSON rendering does not parse"
    );
}

/// The scanner's accessors on a validated span agree with the value read
/// from it.
fn walk(raw: &[u8], value: &Value) {
    assert_eq!(scan::is_nil(raw), value.is_nil());
    if let Some(n) = scan::uint(raw) {
        assert_eq!(Some(n), value.as_u64());
    }
    if let Some(s) = scan::str_bytes(raw) {
        assert!(matches!(value, Value::String(v) if v.as_bytes() == s));
    }
    match value {
        Value::Array(items) => {
            let (n, spans) = scan::items(raw).expect("an array's span reads as items");
            assert_eq!(n, items.len());
            let spans: Vec<_> = spans.collect();
            assert_eq!(spans.len(), items.len());
            for (span, item) in spans.into_iter().zip(items) {
                walk(span, item);
            }
        }
        Value::Map(entries) => {
            let (n, spans) = scan::entries(raw).expect("a map's span reads as entries");
            assert_eq!(n, entries.len());
            let spans: Vec<_> = spans.collect();
            assert_eq!(spans.len(), 2 * entries.len());
            for (pair, (k, v)) in spans.chunks(2).zip(entries) {
                walk(pair[0], k);
                walk(pair[1], v);
            }
        }
        _ => {}
    }
}

/// The worker's three situations: core mode with a NATS reply subject and a
/// slot held, core mode without a NATS reply subject while fenced (no slot),
/// and JetStream mode (the reply subject must be in the body). Built once:
/// resolving the configuration for every input took most of a run's time.
fn situations() -> &'static [(Rules, Option<&'static str>, bool); 3] {
    static SITUATIONS: LazyLock<[(Rules, Option<&'static str>, bool); 3]> = LazyLock::new(|| {
        [
            (rules(), Some("_INBOX.nats.9"), false),
            (rules(), None, true),
            (
                jetstream_rules(),
                Some("$JS.ACK.LLM_PREFILL.handoff.1.1.1.0.0"),
                false,
            ),
        ]
    });
    &SITUATIONS
}

fn ids(fenced: bool) -> TestIds {
    if fenced {
        TestIds::fenced()
    } else {
        TestIds::holding_slot()
    }
}

fn input<'a>(payload: &'a [u8], encoding: Encoding, nats_reply: Option<&'a str>) -> Input<'a> {
    Input {
        payload,
        encoding,
        subject: SOURCE,
        nats_reply,
        deadline_header: None,
        kv_expires_header: None,
        // A time near the deadlines a generated result carries, so both
        // sides of the compare are reached.
        now_ms: NOW_MS,
        published_ms: NOW_MS,
        cancels: prefill_handoff::decision::NO_CANCELS,
    }
}

/// The decisions' wall-clock time, Unix ms.
const NOW_MS: u64 = 1_767_225_600_000;

/// The decision's invariants ([`invariants::check`]: one output, on an
/// allowed subject, no CR or LF in a header, a body the worker can read
/// back), and the headers going through the one header builder.
fn check_decision(d: &Decision, payload: &[u8], encoding: Encoding, rules: &Rules) {
    invariants::check(d, payload, encoding, rules);
    let _ = headers::outgoing(d.headers.clone(), &TraceHeaders::read(None));
}

/// The decision on arbitrary bytes as a MessagePack body, in each of the
/// worker's situations: its invariants hold, and the in-place path decides
/// exactly as the value-tree path does (same decision, same number of IDs
/// minted), as tests/offline/decision_fast.rs checks on generated results.
pub fn decide_msgpack(data: &[u8]) {
    for (rules, nats_reply, fenced) in situations() {
        decided_alike(data, Encoding::MsgPack, rules, *nats_reply, *fenced);
    }
}

/// The decision on `data` as `encoding` in one situation, with its
/// invariants checked and held to the value-tree path's (same decision,
/// same number of IDs minted).
fn decided_alike(
    data: &[u8],
    encoding: Encoding,
    rules: &Rules,
    nats_reply: Option<&str>,
    fenced: bool,
) -> Decision {
    let input = input(data, encoding, nats_reply);
    let (mut fast_ids, mut tree_ids) = (ids(fenced), ids(fenced));
    let d = decide(input, rules, &mut fast_ids);
    check_decision(&d, data, encoding, rules);
    let reference = decide_values(input, rules, &mut tree_ids);
    // The in-place path keeps a JSON producer's text of the values it only
    // copies; the value-tree path writes them compactly: compared as JSON
    // values (key order included).
    let as_tree_writes = |mut d: Decision| {
        if encoding == Encoding::Json {
            let rewrite = |p: &mut Vec<u8>| {
                if let Ok(value) = wire::decode(p, Encoding::Json) {
                    *p = wire::encode(&value, Encoding::Json);
                }
            };
            rewrite(&mut d.payload);
            if let Some(release) = d.release.as_mut() {
                rewrite(&mut release.payload);
            }
        }
        d
    };
    assert_eq!(
        as_tree_writes(d.clone()),
        as_tree_writes(reference),
        "the in-place path and the value-tree path differ ({encoding:?})"
    );
    assert_eq!(
        fast_ids.minted, tree_ids.minted,
        "the paths minted different numbers of IDs"
    );
    d
}

/// The decision on arbitrary bytes as a JSON body, in each of the worker's
/// situations: its invariants hold, the in-place JSON path decides exactly
/// as the value-tree path does (same decision, same number of IDs minted;
/// tests/offline/decision_fast_json.rs checks the same on generated
/// results), and a body that reads as JSON is decided as the same value
/// sent as MessagePack is (same outcome, subject, request ID and frame
/// count).
pub fn decide_json(data: &[u8]) {
    let as_msgpack = wire::decode(data, Encoding::Json)
        .ok()
        .map(|value| wire::encode(&value, Encoding::MsgPack));
    for (rules, nats_reply, fenced) in situations() {
        let (nats_reply, fenced) = (*nats_reply, *fenced);
        let d = decided_alike(data, Encoding::Json, rules, nats_reply, fenced);
        if let Some(bytes) = &as_msgpack {
            let input = self::input(bytes, Encoding::MsgPack, nats_reply);
            let m = decide(input, rules, &mut ids(fenced));
            assert_eq!(
                (&d.outcome, &d.subject, &d.request_id, d.trailing_frames),
                (&m.outcome, &m.subject, &m.request_id, m.trailing_frames),
                "JSON and MessagePack bodies of the same value are decided differently"
            );
        }
    }
}

/// The headers the NATS client hands the worker for `data`: each line
/// `name: value` whose name the client accepts, its value with CR and LF
/// made spaces (what the client delivers: it refuses a line break in a
/// value, and the patched client delivers an unparsable block as its marker
/// alone, which a line naming it here stands for); the rest of a line after
/// a NUL line is the payload. `None` headers for data without a colon.
fn delivered(data: &[u8]) -> (Option<HeaderMap>, &[u8]) {
    let (block, payload) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let mut headers = HeaderMap::new();
    let text = String::from_utf8_lossy(block);
    for line in text.split('\n') {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let Ok(name) = name.trim().parse::<HeaderName>() {
            headers.append(name, HeaderValue::from_lossy(value.trim()));
        }
    }
    let any = text.contains(':');
    (any.then_some(headers), payload)
}

/// The worker's handling of the headers the NATS client delivers
/// ([`delivered`]; the client's own parser is tested against a fake server,
/// tests/server/nats_parser.rs):
/// - no header value it delivers holds CR or LF;
/// - the content type read from the headers ([`headers::first`]),
///   [`decide_received_inline`] (which dead-letters an unparsable header
///   block) and the output's headers with the input's trace headers copied
///   ([`headers::outgoing`]) never panic, and the decision keeps its
///   invariants ([`invariants::check`]);
/// - every trace header of the input reaches the output unchanged.
pub fn nats_headers(data: &[u8]) {
    let (headers, payload) = delivered(data);
    let subject = SOURCE;
    let reply: Option<&str> = Some("llm.replies.fuzz");
    {
        for (name, values) in headers.iter().flat_map(|h| h.iter()) {
            for value in values {
                assert!(
                    !value.as_str().contains(['\r', '\n']),
                    "header {name} holds a line break: {value:?}"
                );
            }
        }
        let encoding = Encoding::from_content_type(headers::first(headers.as_ref(), CONTENT_TYPE));
        for (rules, _, fenced) in situations() {
            let fenced = *fenced;
            let input = Input {
                payload,
                encoding,
                subject,
                nats_reply: reply,
                deadline_header: headers::first(headers.as_ref(), HANDOFF_DEADLINE),
                kv_expires_header: None,
                now_ms: NOW_MS,
                published_ms: NOW_MS,
                cancels: prefill_handoff::decision::NO_CANCELS,
            };
            let headers = headers.as_ref();
            let d = decide_received_inline(input, headers, rules, &mut ids(fenced));
            invariants::check(&d, payload, encoding, rules);
            let trace = TraceHeaders::read(headers);
            // The headers as they go to the client, which frames them: one
            // `name: value` each, no line break in either, no colon in a name.
            let map = headers::outgoing(d.headers.clone(), &trace);
            let out: Vec<(&str, &str)> = map
                .iter()
                .flat_map(|(name, values)| {
                    let name: &str = name.as_ref();
                    values.iter().map(move |value| (name, value.as_str()))
                })
                .collect();
            for (name, value) in &out {
                assert!(
                    !name.contains(['\r', '\n', ':']) && !value.contains(['\r', '\n']),
                    "header {name:?}: {value:?}"
                );
            }
            for (name, max) in [
                (TraceHeader::Traceparent, TRACEPARENT_LEN),
                (TraceHeader::Tracestate, MAX_TRACESTATE_BYTES),
            ] {
                // Names match without regard to case, so an input may carry
                // the header under two spellings.
                let sent = headers
                    .iter()
                    .flat_map(|h| h.iter())
                    .any(|(n, _)| AsRef::<str>::as_ref(n).eq_ignore_ascii_case(name.as_str()));
                let copies = out.iter().filter(|(n, _)| *n == name.as_str()).count();
                assert!(copies <= 1, "{} copied {copies} times", name.as_str());
                match out
                    .iter()
                    .find(|(n, _)| *n == name.as_str())
                    .map(|(_, v)| *v)
                {
                    // Copied: only what was sent, and within the W3C size.
                    Some(copied) => {
                        assert!(sent, "{} copied though none was sent", name.as_str());
                        assert!(
                            copied.len() <= max,
                            "{} copied with {} bytes",
                            name.as_str(),
                            copied.len()
                        );
                    }
                    // Sent and not copied: reported as dropped (and counted).
                    None => assert!(
                        !sent || trace.dropped.contains(&name),
                        "{} sent, neither copied nor dropped",
                        name.as_str()
                    ),
                }
            }
        }
    }
}
