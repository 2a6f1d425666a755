//! The worker holds a bounded number of bytes (`max_in_flight_bytes`), and
//! what the bound refuses still gets an output, counted (issue 9).

use crate::common;
use crate::common::worker_support;

use async_nats::HeaderMap;
use bytes::Bytes;
use common::messages::header;
use common::{Etcd, Nats, Worker, http_get, poll_until, prometheus_samples};
use futures::StreamExt;
use prefill_handoff::headers::names::HANDOFF_PAYLOAD_OMITTED as PAYLOAD_OMITTED;
use prefill_handoff::wire::{Encoding, encode};
use rmpv::Value;
use serde_json::json;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::block_in_place;
use worker_support::{DEAD, InProcess, PREFILL, client, config, fixed_identity};

const MIB: usize = 1024 * 1024;

#[tokio::test(flavor = "current_thread")]
async fn results_past_the_byte_budget_get_an_over_budget_dead_letter_with_their_bytes_and_a_notice()
{
    const N: usize = 20;
    let nats = Nats::start_with_max_payload(Some(2 * MIB));
    let mut config = config(&nats.url());
    // Room for three ~20 KiB results at a time. The NATS client hands
    // 128 KiB or more of waiting messages to the worker per read (its read
    // budget, docs/vendor-async-nats.md), six or more of these at once.
    config.max_in_flight_bytes = 64 * 1024;
    let worker = InProcess::start(&config, fixed_identity(3)).await;
    let test = client(&nats.url()).await;
    let mut outputs = futures::stream::select(
        test.subscribe(DEAD).await.unwrap(),
        test.subscribe("_INBOX.bounds.>").await.unwrap(),
    );
    test.flush().await.unwrap();
    // Even results name their reply subject first, odd ones after 20 KiB of
    // frames: a refused result's client can be told only when the first few
    // KiB name it.
    let body = |i: usize| {
        let head = [
            ("request_id", Value::from(format!("b{i:02}"))),
            ("reply_to", Value::from(format!("_INBOX.bounds.{i:02}"))),
        ];
        let frame = json!([{"finish_reason": "stop", "text": "x".repeat(20 * 1024)}]);
        let frames = ("frames", rmpv::ext::to_value(frame).unwrap());
        let mut pairs: Vec<(&str, Value)> = head.into_iter().collect();
        if i.is_multiple_of(2) {
            pairs.push(frames);
        } else {
            pairs.insert(0, frames);
        }
        let map = pairs
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect();
        encode(&Value::Map(map), Encoding::MsgPack)
    };
    // The burst is sent while this (single) thread is blocked, so the worker
    // finds it all waiting when it runs again: a burst it cannot hold at once.
    let url = nats.url();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let publisher = client(&url).await;
            for i in 0..N {
                publisher.publish(PREFILL, body(i).into()).await.unwrap();
            }
            worker_support::round_trip(&publisher).await;
        });
    })
    .join()
    .unwrap();

    // Each result's one output (a reply, or a dead letter with its bytes),
    // and the over_budget notices its client got.
    let (mut answered, mut refused, mut told) = (HashSet::new(), HashSet::new(), HashSet::new());
    let nameable = |refused: &HashSet<usize>| refused.iter().filter(|i| *i % 2 == 0).count();
    while answered.len() + refused.len() < N || told.len() < nameable(&refused) {
        let message = tokio::time::timeout(Duration::from_secs(30), outputs.next())
            .await
            .unwrap_or_else(|_| {
                panic!("every result gets an output within 30 s: {answered:?} {refused:?} {told:?}")
            })
            .unwrap();
        if message.subject.as_str() == DEAD {
            let headers = message.headers.as_ref();
            assert_eq!(header(headers, "Handoff-Error-Code"), Some("over_budget"));
            assert_eq!(header(headers, PAYLOAD_OMITTED), None);
            let i = (0..N).find(|i| *message.payload == *body(*i));
            let i = i.expect("the dead letter holds the input's bytes unchanged");
            assert!(refused.insert(i), "one dead letter per result");
            continue;
        }
        let i: usize = message.subject.as_str()["_INBOX.bounds.".len()..]
            .parse()
            .unwrap();
        let reply: serde_json::Value = rmp_serde::from_slice(&message.payload).unwrap();
        if reply["error"]["code"] == "over_budget" {
            assert_eq!(reply["request_id"], format!("b{i:02}"));
            assert!(told.insert(i), "one notice per refused result");
        } else {
            assert!(answered.insert(i), "one reply per result");
        }
    }
    eprintln!("answered {}, refused {}", answered.len(), refused.len());
    assert!(
        !answered.is_empty(),
        "results within the budget are answered"
    );
    assert!(
        !refused.is_empty(),
        "a burst past the budget is refused, not held"
    );
    let named_first: HashSet<usize> = refused.iter().copied().filter(|i| i % 2 == 0).collect();
    assert_eq!(
        told, named_first,
        "each refused result's client is told when it can be named"
    );
    assert!(answered.is_disjoint(&refused), "one output per result");
    let report = worker.stop().await;
    assert_eq!(report.counts.received, N as u64);
    assert_eq!(report.counts.published, N as u64, "each got one output");
}

/// A prefill result of exactly 1 MiB whose first frame holds an array of
/// `nil` (MessagePack) or `null` (JSON), and no handoff parameters: decided
/// by the tree path before the decision bound. `reply_to` ends in `{i:05}`
/// at `digits`, patched per message.
fn hostile(json: bool) -> (Vec<u8>, usize) {
    let reply = "_INBOX.burst.00000";
    if json {
        let head = format!(r#"{{"request_id":"h","reply_to":"{reply}","frames":[{{"x":["#);
        let mut body = head.clone().into_bytes();
        while body.len() + 10 < MIB {
            body.extend_from_slice(b"null,");
        }
        body.extend_from_slice(b"null]}]}");
        body.resize(MIB, b' ');
        (body, head.find("00000").unwrap())
    } else {
        let mut body = Vec::new();
        body.push(0x83);
        for s in ["request_id", "h", "reply_to", reply, "frames"] {
            body.push(0xa0 | s.len() as u8);
            body.extend_from_slice(s.as_bytes());
        }
        let digits = body.len() - 5 - 1 - "frames".len();
        body.extend_from_slice(&[0x91, 0x81, 0xa1, b'x', 0xdd]);
        let n = MIB - body.len() - 4;
        body.extend_from_slice(&(n as u32).to_be_bytes());
        body.resize(MIB, 0xc0);
        (body, digits)
    }
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// The issue's measurement, as a test: before the bounds a core-mode worker
/// passed 1 GiB (nats-server 2.9.10), or was cut off five times as a slow
/// consumer with ~1,700 of 2,000 results getting no output (2.15).
///
/// Runs on both server builds (scripts/test.sh re-runs it on the second).
/// Measured in a debug build on a shared 2-core machine:
///
/// - Before results were read in place by the runner and the per-result
///   future shrank (19.6 KB -> 3.75 KB): 2.9.10 passed at 141-165 MiB; 2.15.1
///   cut the worker off as a slow consumer 2 to 8 times per burst ("Slow
///   Consumer Detected: MaxPending of 67108864 Exceeded" in its log; the
///   client sees only EOF, no `-ERR`) and 293-965 results got no output and
///   no count: its stall gate holds a fast publisher back only briefly, so a
///   worker that reads slower than the publisher writes loses what the server
///   had queued (core mode is at most once; JetStream mode loses nothing).
///   With the read in place alone, 2 of 4 runs on 2.15 still lost 60-67.
/// - Now each refused result's dead letter carries its bytes while the
///   refused bytes not yet written fit the allowance (`pipeline::refuse`),
///   and its client is told: 2.9.10 peak 170 MiB, 1,254 dead letters with
///   their bytes and 618 without, all 1,872 clients told; 2.15 peak
///   139 MiB, 1,265 and 625. Waiting until each dead letter was written
///   instead held the whole burst (1.5 GiB): the server holds back a
///   publisher whose subscribers lag.
///
/// A worker slower than the publisher on 2.15 can still be cut off
/// (docs/design.md, "Bounds"): on 2.10 and later the burst is sent at most
/// 40 results ahead of their outputs, so that a CPU-starved worker is not
/// failed for what the server dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_burst_of_2000_hostile_1mib_results_stays_under_256_mib_and_all_are_counted() {
    const N: usize = 2000;
    let nats = Nats::start_with_max_payload(Some(2 * MIB));
    let etcd = Etcd::start();
    let (worker, metrics_addr) = Worker::run_with_env(&nats.url(), &etcd, &[]);
    let up = block_in_place(|| {
        worker.wait_for_log("consuming prefill results", Duration::from_secs(30))
    });
    assert!(up, "the worker did not start:\n{}", worker.log());
    let pid = worker.pid().unwrap();

    let test = client(&nats.url()).await;
    let watcher = client(&nats.url()).await;
    let mut replies = watcher.subscribe("_INBOX.burst.>").await.unwrap();
    let mut dead = watcher.subscribe(DEAD).await.unwrap();
    // The server has the subscriptions before the worker answers (a flush
    // only writes the socket).
    worker_support::round_trip(&watcher).await;
    let bodies = Arc::new([hostile(false), hostile(true)]);
    let counts = Arc::new(Mutex::new(Tally::default()));
    let sink = Arc::clone(&counts);
    let templates = Arc::clone(&bodies);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                Some(m) = replies.next() => {
                    let code = serde_json::from_slice::<serde_json::Value>(&m.payload)
                        .ok()
                        .or_else(|| rmp_serde::from_slice(&m.payload).ok())
                        .and_then(|v| v["error"]["code"].as_str().map(str::to_string));
                    let i: usize = m.subject.as_str()["_INBOX.burst.".len()..].parse().unwrap();
                    let mut c = sink.lock().unwrap();
                    let new = match code.as_deref() {
                        Some("malformed") => c.malformed.insert(i),
                        Some("over_budget") => c.told.insert(i),
                        other => panic!("reply {other:?} ({} bytes)", m.payload.len()),
                    };
                    c.duplicates += usize::from(!new);
                }
                Some(m) = dead.next() => {
                    let code = header(m.headers.as_ref(), "Handoff-Error-Code");
                    let index = which(&m.payload, &templates[..]).filter(|_| code == Some("over_budget"));
                    let omitted = header(m.headers.as_ref(), PAYLOAD_OMITTED);
                    let bare = code == Some("over_budget") && m.payload.is_empty() && omitted == Some(&*MIB.to_string());
                    let mut c = sink.lock().unwrap();
                    match index {
                        Some(i) if !c.refused.insert(i) => c.duplicates += 1,
                        Some(_) => {}
                        None if bare => c.bare += 1,
                        None => c.bad_dead += 1,
                    }
                }
                else => break,
            }
        }
    });
    let total = move || {
        let c = counts.lock().unwrap();
        c.clone()
    };

    // nats-server 2.10 and later hold a fast publisher back only briefly and
    // cut a subscriber off past its 64 MiB `max_pending`, losing what it had
    // queued (core NATS is at most once): a worker starved of CPU by other
    // work on the machine then fails this test for the server's loss, not
    // its own. There, at most WINDOW results are sent ahead of their
    // outputs, so that the server never queues more than that for the
    // worker; the worker still reads far past its 8 MiB budget and refuses.
    // Earlier servers hold the publisher back: the burst goes unpaced.
    const WINDOW: usize = 40;
    let version = test.server_info().version;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let paced = (parts.next(), parts.next()) >= (Some(2), Some(10));
    let mut json_headers = HeaderMap::new();
    json_headers.insert("Content-Type", "application/json");
    for i in 0..N {
        while paced && {
            let c = total();
            i > c.malformed.len() + c.refused.len() + c.bare + WINDOW
        } {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (template, at) = &bodies[i % 2];
        let mut body = template.clone();
        body[*at..*at + 5].copy_from_slice(format!("{i:05}").as_bytes());
        let payload = Bytes::from(body);
        if i % 2 == 1 {
            test.publish_with_headers(PREFILL, json_headers.clone(), payload)
                .await
                .unwrap();
        } else {
            test.publish(PREFILL, payload).await.unwrap();
        }
    }
    test.flush().await.unwrap();

    // Every result ends as an output or a counted drop.
    let scrape = || prometheus_samples(&http_get(&metrics_addr, "/metrics").body);
    poll_until(Duration::from_secs(180), || async {
        let drops = block_in_place(scrape)["handoff_nats_slow_consumer_drops_total"] as usize;
        let c = total();
        c.malformed.len() + c.refused.len() + c.bare + c.bad_dead + drops >= N
            && c.told.len() >= c.refused.len() + c.bare
    })
    .await;
    // Long enough for a duplicate to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let samples = block_in_place(scrape);
    let c = total();
    let drops = samples["handoff_nats_slow_consumer_drops_total"] as usize;
    let metric_refused = samples["handoff_dead_letters_total{code=\"over_budget\"}"] as usize;
    let told_key = "handoff_error_responses_total{code=\"over_budget\"}";
    let metric_told = samples.get(told_key).copied().unwrap_or_default() as usize;
    let hwm = vm_hwm_kib(pid);
    let ready = block_in_place(|| http_get(&metrics_addr, "/readyz")).status;
    let log = worker.log();
    let (malformed, refused, told, bare) =
        (c.malformed.len(), c.refused.len(), c.told.len(), c.bare);
    eprintln!(
        "VmHWM {} MiB; replies malformed {malformed}; over_budget dead letters with their bytes {refused}, without {bare}, told {told}; duplicates {}, bad dead letters {}; drops {drops}; metrics {metric_refused}/{metric_told}",
        hwm / 1024,
        c.duplicates,
        c.bad_dead,
    );
    assert_eq!(c.duplicates, 0, "one output per result");
    assert_eq!(
        c.bad_dead, 0,
        "every dead letter is over_budget, with its input's bytes unchanged or without them saying how many"
    );
    assert!(c.malformed.is_disjoint(&c.told), "one output per result");
    let server_log = nats.log();
    let events: Vec<&str> = log
        .lines()
        .chain(server_log.lines())
        .filter(|l| l.contains("onnection") || l.contains("low") || l.contains("refused"))
        .take(40)
        .collect();
    assert_eq!(
        malformed + refused + bare + drops,
        N,
        "outputs + refused + counted drops; connection events:\n{}",
        events.join("\n")
    );
    // Every hostile result names its reply subject in its first bytes: each
    // refused one's client is told, whether its dead letter could carry its
    // bytes or not (the refused bytes not yet written were over the
    // allowance; the server holds back a publisher whose subscribers lag).
    assert!(
        c.refused.is_subset(&c.told),
        "each refused result's client is told"
    );
    assert_eq!(told, refused + bare, "each refused result's client is told");
    assert!(
        refused >= 1,
        "dead letters carry their bytes while the allowance has room"
    );
    assert_eq!(refused + bare, metric_refused, "refusals are counted");
    assert_eq!(told, metric_told, "notices are counted");
    assert!(hwm < 256 * 1024, "peak RSS {} MiB", hwm / 1024);
    assert_eq!(ready, 200, "still ready:\n{log}");
}

/// What the burst's watcher saw, by result index.
#[derive(Debug, Default, Clone)]
struct Tally {
    /// Replies `malformed`: the result was decided.
    malformed: HashSet<usize>,
    /// Replies `over_budget`: the client of a refused result was told.
    told: HashSet<usize>,
    /// Dead letters `over_budget` holding the result's bytes unchanged.
    refused: HashSet<usize>,
    /// Dead letters `over_budget` without the bytes, saying how many.
    bare: usize,
    duplicates: usize,
    /// Any other dead letter, or one without the result's bytes.
    bad_dead: usize,
}

/// The index of the hostile result `payload` is, byte for byte, if any.
fn which(payload: &[u8], templates: &[(Vec<u8>, usize)]) -> Option<usize> {
    templates.iter().enumerate().find_map(|(kind, (body, at))| {
        let digits = std::str::from_utf8(payload.get(*at..*at + 5)?).ok()?;
        let i: usize = digits.parse().ok()?;
        let same = payload.len() == body.len()
            && payload[..*at] == body[..*at]
            && payload[*at + 5..] == body[*at + 5..];
        (same && i % 2 == kind).then_some(i)
    })
}
