//! Observing outputs (core subscriptions, streams) and the work queue.

use super::traffic::{Expect, Input, mixed, publish_all, request_id_of};
use super::{DEAD, GEN};
use crate::common::fence::Fence;
use crate::common::{Nats, poll_until};
use async_nats::Client;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream::Stream};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One output seen on a core subscription.
#[derive(Debug, Clone)]
pub struct Seen {
    pub kind: Expect,
    pub subject: String,
    pub request_id: String,
    pub payload: Vec<u8>,
    pub headers: Option<HeaderMap>,
}

/// Every output published on GEN, the reply subjects and the dead-letter subject.
#[derive(Clone)]
pub struct Collector {
    seen: Arc<Mutex<Vec<Seen>>>,
    fence: Fence,
}

impl Collector {
    /// Subscribes on `client`; returns once the server has the subscription
    /// (a fence came back through it).
    pub async fn start(client: &Client) -> Collector {
        let seen = Arc::new(Mutex::new(Vec::new()));
        // One subscription, so that a fence is seen after everything the
        // server routed before it; the fences under it, on a subject no
        // worker uses and no stream captures.
        let mut sub = client.subscribe("llm.>").await.expect("subscribe");
        let fence = Fence::new(client, "llm.test-fence");
        let (sink, fenced) = (seen.clone(), fence.clone());
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let kind = match m.subject.as_str() {
                    GEN => Expect::Gen,
                    DEAD => Expect::Dead,
                    s if s.starts_with("llm.replies.") => Expect::Reply,
                    s if fenced.came_back(s) => continue,
                    // What the test publishes: results, cancels.
                    _ => continue,
                };
                let request_id = request_id_of(&m.payload, m.headers.as_ref());
                sink.lock().unwrap().push(Seen {
                    kind,
                    subject: m.subject.to_string(),
                    request_id,
                    payload: m.payload.to_vec(),
                    headers: m.headers.clone(),
                });
            }
        });
        let collector = Collector { seen, fence };
        collector.fence().await;
        collector
    }

    /// Returns once this collector has recorded everything the server had
    /// routed to it before the call ([`Fence`]).
    pub async fn fence(&self) {
        self.fence.pass().await;
    }

    pub fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until at least `n` outputs were seen; false on timeout.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> bool {
        poll_until(timeout, || async { self.len() >= n }).await
    }

    /// Outputs per request ID and kind.
    pub fn counts(&self) -> BTreeMap<(String, Expect), usize> {
        let mut counts = BTreeMap::new();
        for s in self.all() {
            *counts.entry((s.request_id, s.kind)).or_insert(0) += 1;
        }
        counts
    }
}

/// The request IDs of every decode job stored in the GEN stream, in order.
pub async fn gen_stream_request_ids(js: &jetstream::Context) -> Vec<String> {
    stream_contents(js, "LLM_GEN")
        .await
        .into_iter()
        .map(|s| s.request_id)
        .collect()
}

/// Every message stored in a stream, attributed to its request ID.
pub async fn stream_contents(js: &jetstream::Context, name: &str) -> Vec<Seen> {
    let stream: Stream = js.get_stream(name).await.expect("stream");
    let state = stream.get_info().await.expect("info").state;
    let total = state.messages as usize;
    if total == 0 {
        return Vec::new();
    }
    // Read by sequence from the stream's leader (`STREAM.MSG.GET`, which
    // nats-server 2.9 has): no consumer whose state a leader change can
    // stall. An ordered consumer, used before, stalled in about 3 of 10 CI
    // runs of the cluster test that kills the prefill stream's leader,
    // right after it rejoined: "ordered consumer: TimedOut", or no message
    // for 10 s midway. A request that fails (timed out, no responders or
    // an API error while a leader is elected) is tried again, for up to 30 s.
    let failed = |e: &jetstream::stream::RawMessageError| {
        matches!(
            e.kind(),
            jetstream::stream::RawMessageErrorKind::Other
                | jetstream::stream::RawMessageErrorKind::JetStream(_)
        )
    };
    let stream = &stream;
    let read = futures::stream::iter(state.first_sequence..=state.last_sequence)
        .map(|sequence| async move {
            super::while_transient("stream message by sequence", failed, || async {
                match stream.get_raw_message(sequence).await {
                    Ok(m) => Ok(Some(m)),
                    // Deleted (a work queue's acked message): not there.
                    Err(e)
                        if e.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            })
            .await
        })
        .buffered(16)
        .filter_map(|m| async move { m });
    let mut out = Vec::with_capacity(total);
    let mut read = std::pin::pin!(read);
    while let Some(m) = read.next().await {
        let subject = m.subject.to_string();
        let kind = if subject == GEN {
            Expect::Gen
        } else if subject == DEAD {
            Expect::Dead
        } else {
            Expect::Reply
        };
        let headers = (!m.headers.is_empty()).then_some(m.headers);
        out.push(Seen {
            kind,
            request_id: request_id_of(&m.payload, headers.as_ref()),
            subject,
            payload: m.payload.to_vec(),
            headers,
        });
    }
    assert_eq!(out.len(), total, "{name}: every stored message read");
    out
}

/// Where [`fence_outputs`] publishes into the capture stream.
const OUTPUTS_FENCE: &str = "test.harness.outputs-fence";

/// A stream that stores every reply and dead letter, so that outputs
/// published while a test's own connection is down are still counted.
pub async fn capture_outputs(js: &jetstream::Context) {
    js.create_stream(jetstream::stream::Config {
        name: "OUTPUTS".into(),
        subjects: vec!["llm.replies.>".into(), DEAD.into(), OUTPUTS_FENCE.into()],
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("capture stream");
}

/// Per request ID and kind, how many outputs.
pub fn count(seen: &[Seen]) -> BTreeMap<(String, Expect), usize> {
    let mut counts = BTreeMap::new();
    for s in seen {
        *counts.entry((s.request_id.clone(), s.kind)).or_insert(0) += 1;
    }
    counts
}

/// Checks that every input has at least one output of the expected kind and
/// nothing else; returns the duplicates (request ID, kind, count) to report.
pub fn check_outputs(inputs: &[Input], seen: &[Seen]) -> Vec<(String, Expect, usize)> {
    let counts = count(seen);
    let mut missing = Vec::new();
    for input in inputs {
        if counts
            .get(&(input.request_id.clone(), input.expect))
            .copied()
            .unwrap_or(0)
            == 0
        {
            missing.push(format!("{} {:?}", input.request_id, input.expect));
        }
    }
    assert!(
        missing.is_empty(),
        "{} results have no output, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let expected: std::collections::BTreeSet<_> = inputs
        .iter()
        .map(|i| (i.request_id.clone(), i.expect))
        .collect();
    let strays: Vec<_> = counts.keys().filter(|k| !expected.contains(k)).collect();
    assert!(
        strays.is_empty(),
        "outputs of the wrong kind or for unknown requests: {strays:?}"
    );
    counts
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((id, kind), n)| (id, kind, n))
        .collect()
}

/// A run's outputs ([`all_outputs`]: GEN holds each decode job once)
/// checked against `inputs` ([`check_outputs`]); with `live`, the replies
/// and dead letters only that collector saw count too
/// ([`with_live_outputs`]: across a server restart). Prints the
/// duplicates, under `what`, and returns them.
pub async fn check_stored(
    js: &jetstream::Context,
    inputs: &[Input],
    live: Option<&Collector>,
    what: &str,
) -> Vec<(String, Expect, usize)> {
    let mut outputs = all_outputs(js).await;
    if let Some(collector) = live {
        outputs = with_live_outputs(outputs, collector);
    }
    let dups = check_outputs(inputs, &outputs);
    println!(
        "{what}: {} request IDs had more than one output",
        dups.len()
    );
    for (id, kind, n) in dups.iter().take(20) {
        println!("  duplicate: {id} {kind:?} x{n}");
    }
    dups
}

/// The nats-server restart under load, whoever the workers are: 10,000
/// mixed results published, the server restarted gracefully once a fifth
/// of them are answered; then everything is delivered and acked within
/// `consumed_within`, every result has its output ([`check_stored`], the live
/// outputs counted too), and the work queue drains (acked messages the
/// restarted server kept are swept by the idle workers).
pub async fn restart_mid_run(
    nats: &mut Nats,
    js: &jetstream::Context,
    collector: &Collector,
    consumed_within: Duration,
) {
    let n = 10_000;
    let inputs: Vec<Input> = (0..n).map(mixed).collect();
    publish_all(js, &inputs).await;
    assert!(collector.wait_for(n / 5, Duration::from_secs(60)).await);
    nats.restart_gracefully();
    println!("nats-server restarted after {} outputs", collector.len());
    assert!(
        wait_consumed(js, consumed_within).await,
        "not everything was delivered and acked after the restart: {}",
        queue_state(js).await
    );
    check_stored(js, &inputs, Some(collector), "after a nats-server restart").await;
    let left = prefill_left(js).await;
    if left > 0 {
        println!("{left} acked messages kept by the restarted server; waiting for the sweep");
    }
    assert!(
        wait_drained(js, Duration::from_secs(30)).await,
        "prefill stream not empty: {}",
        queue_state(js).await
    );
}

/// Messages left in the prefill work queue.
pub async fn prefill_left(js: &jetstream::Context) -> u64 {
    let stream = js.get_stream("LLM_PREFILL").await.expect("prefill stream");
    stream.get_info().await.expect("info").state.messages
}

/// The shared consumer's counters: (ack pending, redelivered, pending).
pub async fn consumer_counters(js: &jetstream::Context) -> (usize, usize, u64) {
    let stream = js.get_stream("LLM_PREFILL").await.expect("prefill stream");
    let info = stream.consumer_info("handoff").await.expect("consumer");
    (info.num_ack_pending, info.num_redelivered, info.num_pending)
}

/// Waits until `answered` (the workers' output counters, summed) accounts
/// for every delivery the consumer has made: with the work queue drained, a
/// redelivery of a result already acked has then been answered too, so a
/// duplicate would be among the outputs. For traffic whose every delivery
/// gets an output (no deferrals).
pub async fn wait_every_delivery_answered(
    js: &jetstream::Context,
    timeout: Duration,
    answered: impl Fn() -> u64,
) -> bool {
    poll_until(timeout, || async { answered() >= deliveries(js).await }).await
}

/// Waits until the shared consumer has redelivered at least `at_least`
/// messages (an event to wait for instead of a fixed sleep).
pub async fn wait_redelivered(js: &jetstream::Context, at_least: usize, timeout: Duration) -> bool {
    poll_until(timeout, || async {
        consumer_counters(js).await.1 >= at_least
    })
    .await
}

/// Waits until the work queue is empty and nothing is pending an ack
/// ([`drained`]).
pub async fn wait_drained(js: &jetstream::Context, timeout: Duration) -> bool {
    poll_until(timeout, || drained(js)).await
}

/// True when the server's counters say the work queue is done: the prefill
/// stream is empty, and its consumer has nothing pending and nothing
/// waiting for an ack.
pub async fn drained(js: &jetstream::Context) -> bool {
    if let Ok(stream) = js.get_stream("LLM_PREFILL").await
        && let (Ok(info), Ok(c)) = (
            stream.get_info().await,
            stream.consumer_info("handoff").await,
        )
    {
        info.state.messages == 0 && c.num_ack_pending == 0 && c.num_pending == 0
    } else {
        false
    }
}

/// How many deliveries the shared consumer has made (redeliveries included).
pub async fn deliveries(js: &jetstream::Context) -> u64 {
    let stream = js.get_stream("LLM_PREFILL").await.expect("prefill stream");
    let info = stream.consumer_info("handoff").await.expect("consumer");
    info.delivered.consumer_sequence
}

/// The prefill stream's and the consumer's state, for failure messages.
pub async fn queue_state(js: &jetstream::Context) -> String {
    let stream = js.get_stream("LLM_PREFILL").await.expect("prefill stream");
    let info = stream.get_info().await.expect("info");
    let c = stream.consumer_info("handoff").await.expect("consumer");
    format!(
        "stream: {:?}; consumer: delivered {:?} ack_floor {:?} ack_pending {} redelivered {} pending {} waiting {}",
        info.state,
        c.delivered,
        c.ack_floor,
        c.num_ack_pending,
        c.num_redelivered,
        c.num_pending,
        c.num_waiting
    )
}

/// Waits until the consumer has delivered and settled everything.
pub async fn wait_consumed(js: &jetstream::Context, timeout: Duration) -> bool {
    poll_until(timeout, || async {
        if let Ok(stream) = js.get_stream("LLM_PREFILL").await
            && let Ok(c) = stream.consumer_info("handoff").await
        {
            c.num_ack_pending == 0 && c.num_pending == 0
        } else {
            false
        }
    })
    .await
}

/// `stored` (from [`all_outputs`]) plus the replies and dead letters only
/// the live `collector` saw. Across a server restart the capture stream can
/// miss one: the server routes a core message to its subscribers, the
/// worker's confirmation probe among them, before the stream stores it from
/// a queue of its own, and a shutdown in between drops it from that queue
/// (seen once under load: one reply of 10,000, acked by the worker after its
/// probe came back). Decode jobs are counted from the GEN stream only, which
/// acknowledged each.
pub fn with_live_outputs(mut stored: Vec<Seen>, collector: &Collector) -> Vec<Seen> {
    let known = count(&stored);
    stored.extend(
        collector.all().into_iter().filter(|s| {
            s.kind != Expect::Gen && !known.contains_key(&(s.request_id.clone(), s.kind))
        }),
    );
    stored
}

/// Returns once the capture stream has stored every output the server had
/// routed before the call: the stream stores what it captures in the order
/// the server routed it, and this fence's ack comes after it is stored.
pub async fn fence_outputs(js: &jetstream::Context) {
    js.publish(OUTPUTS_FENCE, "".into())
        .await
        .expect("publish the capture stream's fence")
        .await
        .expect("the capture stream stores its fence");
}

/// Every output of a run: the replies and dead letters captured in the
/// `OUTPUTS` stream (behind a [`fence_outputs`], so every one routed before
/// the call is in) plus one [`Seen`] per decode job stored in the GEN
/// stream. Asserts that the GEN stream holds each decode job once (the
/// `Nats-Msg-Id` duplicate window at work).
pub async fn all_outputs(js: &jetstream::Context) -> Vec<Seen> {
    fence_outputs(js).await;
    let gen_ids = gen_stream_request_ids(js).await;
    let mut unique = gen_ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        gen_ids.len(),
        "GEN stream holds each decode job once"
    );
    let mut outputs = stream_contents(js, "OUTPUTS").await;
    outputs.retain(|s| s.subject != OUTPUTS_FENCE);
    outputs.extend(gen_ids.into_iter().map(|request_id| Seen {
        kind: Expect::Gen,
        subject: GEN.into(),
        request_id,
        payload: Vec::new(),
        headers: None,
    }));
    outputs
}
