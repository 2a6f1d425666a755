//! The network side of a run: subscribe to every output subject, warm up,
//! publish the pre-encoded messages at the asked rate, collect the outputs.
//!
//! One connection publishes and another subscribes, so neither direction
//! queues behind the other. Payloads are encoded before the timed window and
//! publishes are not awaited one by one (core NATS is fire-and-forget; in
//! JetStream mode up to `concurrency` acks are outstanding).

use super::mix::OutputKind;
use super::payload::{self, RunIds, Tag, Template};
use super::report::{Report, Timing};
use super::tally::{Channel, Tally};
use super::{LoadgenError, Options};
use async_nats::{Client, Event, Subject};
use bytes::Bytes;
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Counters the progress line and the warm-up read while the run goes on.
#[derive(Default)]
struct Progress {
    sent: AtomicU64,
    matched: AtomicU64,
    warmup: AtomicU64,
    slow_consumer: AtomicU64,
}

/// Runs one load test and reports what arrived.
pub async fn run(opts: &Options) -> Result<Report, LoadgenError> {
    let ids = RunIds::new(&opts.run_id);
    let template = Template {
        reply_to: opts.reply_subject.clone(),
        refused_reply_to: opts.refused_reply_to.clone(),
        opaque_bytes: opts.opaque_bytes,
    };
    let kinds = opts.mix.schedule(opts.count);
    let expected: Vec<OutputKind> = kinds
        .iter()
        .map(|k| {
            if opts.expect_relay {
                OutputKind::Relayed
            } else {
                k.expected()
            }
        })
        .collect();
    let encode_all = |tag: fn(usize) -> Tag, n: usize| -> Vec<Bytes> {
        let mut nth: HashMap<super::mix::Kind, u64> = HashMap::new();
        opts.mix
            .schedule(n)
            .into_iter()
            .enumerate()
            .map(|(seq, kind)| {
                let count = nth.entry(kind).or_default();
                let encode = if opts.json {
                    payload::encode_json
                } else {
                    payload::encode
                };
                let bytes = encode(
                    &template,
                    kind,
                    &ids.request_id(tag(seq)),
                    seq as u64,
                    *count,
                );
                *count += 1;
                Bytes::from(bytes)
            })
            .collect()
    };
    let warmup = encode_all(Tag::Warmup, opts.warmup);
    let measured = encode_all(Tag::Measured, opts.count);
    // The request IDs whose results are to be cancelled, from both schedules.
    let cancelled: Vec<String> = [
        (Tag::Warmup as fn(usize) -> Tag, opts.warmup),
        (Tag::Measured, opts.count),
    ]
    .into_iter()
    .flat_map(|(tag, n)| {
        let ids = &ids;
        opts.mix
            .schedule(n)
            .into_iter()
            .enumerate()
            .filter(|(_, kind)| *kind == super::mix::Kind::Cancelled)
            .map(move |(seq, _)| ids.request_id(tag(seq)))
    })
    .collect();
    drop(kinds);

    let progress = Arc::new(Progress::default());
    let outputs = opts.count + opts.warmup;
    let sub_client = connect(opts, "loadgen-sub", outputs + 4096, &progress).await?;
    let pub_client = connect(opts, "loadgen-pub", 65_536, &progress).await?;
    let subscribe = |subject: &str, channel: Channel| {
        let client = sub_client.clone();
        let subject = subject.to_string();
        async move {
            client
                .subscribe(subject.clone())
                .await
                .map(move |s| s.map(move |m| (channel, m.payload)))
                .map_err(|e| LoadgenError::Nats(format!("subscribe to {subject}: {e}")))
        }
    };
    let gen_sub = subscribe(&opts.gen_subject, Channel::Gen).await?;
    let reply_sub = subscribe(&opts.reply_subject, Channel::Reply).await?;
    let dead_sub = subscribe(&opts.dead_letter_subject, Channel::DeadLetter).await?;
    // The server has registered the subscriptions once a round trip returns.
    sub_client
        .flush()
        .await
        .map_err(|e| LoadgenError::Nats(format!("flush: {e}")))?;
    let merged = futures::stream::select(gen_sub, futures::stream::select(reply_sub, dead_sub));

    let origin = Instant::now();
    let (deadline_tx, deadline_rx) = watch::channel(None);
    let tally = Tally::new(ids, expected);
    let collector = tokio::spawn(collect(
        merged,
        tally,
        origin,
        deadline_rx,
        opts.linger,
        progress.clone(),
    ));
    let ticker = opts
        .progress
        .then(|| tokio::spawn(print_progress(progress.clone(), opts.count)));

    let publisher = Publisher::new(pub_client.clone(), opts)?;
    cancel_first(&pub_client, &opts.cancel_subject, &cancelled).await?;
    if !warmup.is_empty() {
        let mut scratch = Vec::new();
        publisher
            .publish_all(warmup, 0.0, origin, &mut scratch, &Progress::default())
            .await;
        let want = opts.warmup as u64;
        let until = Instant::now() + opts.timeout;
        while progress.warmup.load(Ordering::Relaxed) < want && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    let mut sent_ns = Vec::with_capacity(opts.count);
    let errors = publisher
        .publish_all(measured, opts.rate, origin, &mut sent_ns, &progress)
        .await;
    let publish_end_ns = nanos_since(origin);
    let _ = deadline_tx.send(Some(Instant::now() + opts.timeout));
    let tally = collector
        .await
        .map_err(|e| LoadgenError::Nats(format!("the collector task failed: {e}")))?;
    if let Some(ticker) = ticker {
        ticker.abort();
    }
    drop(deadline_tx);
    let _ = pub_client.drain().await;
    let _ = sub_client.drain().await;
    Ok(Report::new(
        &tally,
        Timing {
            run_id: opts.run_id.clone(),
            mix: opts.mix.to_string(),
            rate: opts.rate,
            sent_ns,
            publish_errors: errors.count,
            publish_error_examples: errors.examples,
            publish_end_ns,
            slow_consumer_events: progress.slow_consumer.load(Ordering::Relaxed),
        },
    ))
}

/// Publishes a cancel for each of `request_ids` before the run, and gives
/// the workers time to take them: a cancel and its result travel on
/// different subscriptions of a worker, so a result sent right after its
/// cancel could overtake it and go to decode. One second, plus one per
/// 20,000 cancels (a debug-build worker takes that many in well under a
/// second).
async fn cancel_first(
    client: &Client,
    subject: &str,
    request_ids: &[String],
) -> Result<(), LoadgenError> {
    if request_ids.is_empty() {
        return Ok(());
    }
    for id in request_ids {
        let body = payload::to_msgpack(&payload::from_pairs([(
            "request_id",
            rmpv::Value::from(id.as_str()),
        )]));
        client
            .publish(subject.to_string(), Bytes::from(body))
            .await
            .map_err(|e| LoadgenError::Nats(format!("publish a cancel on {subject}: {e}")))?;
    }
    client
        .flush()
        .await
        .map_err(|e| LoadgenError::Nats(format!("flush: {e}")))?;
    let settle = Duration::from_secs(1) + Duration::from_secs(request_ids.len() as u64 / 20_000);
    tokio::time::sleep(settle).await;
    Ok(())
}

async fn connect(
    opts: &Options,
    name: &str,
    capacity: usize,
    progress: &Arc<Progress>,
) -> Result<Client, LoadgenError> {
    let progress = progress.clone();
    let connect = &opts.connect;
    connect
        .options
        .clone()
        .name(format!("{name}-{}", opts.run_id))
        .subscription_capacity(capacity.max(65_536))
        .client_capacity(65_536)
        .event_callback(move |event| {
            if let Event::SlowConsumer(_) = event {
                progress.slow_consumer.fetch_add(1, Ordering::Relaxed);
            }
            async {}
        })
        .connect(connect.servers.clone())
        .await
        .map_err(|e| LoadgenError::Nats(format!("connect to {}: {e}", connect.display)))
}

fn nanos_since(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Records outputs until every message has one (then lingers to catch
/// duplicates) or the deadline set after publishing passes.
async fn collect(
    mut outputs: impl futures::Stream<Item = (Channel, Bytes)> + Unpin,
    mut tally: Tally,
    origin: Instant,
    mut deadline: watch::Receiver<Option<Instant>>,
    linger: Duration,
    progress: Arc<Progress>,
) -> Tally {
    let mut linger_until: Option<Instant> = None;
    loop {
        let until = match (*deadline.borrow(), linger_until) {
            (Some(d), Some(l)) => Some(d.min(l)),
            (d, l) => d.or(l),
        };
        let sleep = async move {
            match until {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            item = outputs.next() => {
                let Some((channel, payload)) = item else { break };
                tally.record(channel, &payload, nanos_since(origin));
                progress.matched.store(tally.unique, Ordering::Relaxed);
                progress.warmup.store(tally.warmup, Ordering::Relaxed);
                if linger_until.is_none() && tally.complete() {
                    linger_until = Some(Instant::now() + linger);
                }
            }
            changed = deadline.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            () = sleep => break,
        }
    }
    tally
}

async fn print_progress(progress: Arc<Progress>, total: usize) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let mut last = 0;
    loop {
        tick.tick().await;
        let matched = progress.matched.load(Ordering::Relaxed);
        eprintln!(
            "loadgen: {:>4.0}s sent {}/{total}  outputs {}/{total}  {} outputs/s",
            start.elapsed().as_secs_f64(),
            progress.sent.load(Ordering::Relaxed),
            matched,
            matched.saturating_sub(last)
        );
        last = matched;
    }
}

#[derive(Default)]
struct PublishErrors {
    count: u64,
    examples: Vec<String>,
}

impl PublishErrors {
    fn add(&mut self, what: String) {
        self.count += 1;
        if self.examples.len() < 3 {
            self.examples.push(what);
        }
    }
}

struct Publisher {
    client: Client,
    jetstream: Option<async_nats::jetstream::Context>,
    subject: Subject,
    concurrency: usize,
    /// `Content-Type: application/json` on every result, for JSON runs.
    headers: Option<async_nats::HeaderMap>,
}

impl Publisher {
    fn new(client: Client, opts: &Options) -> Result<Publisher, LoadgenError> {
        Ok(Publisher {
            jetstream: opts
                .jetstream
                .then(|| async_nats::jetstream::new(client.clone())),
            client,
            subject: Subject::from(opts.prefill_subject.as_str()),
            concurrency: opts.concurrency.max(1),
            headers: opts.json.then(|| {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Content-Type", "application/json");
                headers
            }),
        })
    }

    /// Publishes every payload in order, `rate` per second (0 = as fast as
    /// possible), recording each send instant in `sent_ns`.
    async fn publish_all(
        &self,
        payloads: Vec<Bytes>,
        rate: f64,
        origin: Instant,
        sent_ns: &mut Vec<u64>,
        progress: &Progress,
    ) -> PublishErrors {
        let total = payloads.len();
        let mut errors = PublishErrors::default();
        let mut acks = FuturesUnordered::new();
        let mut pacer = Pacer::new(rate);
        let mut payloads = payloads.into_iter();
        let mut seq = 0;
        while seq < total {
            let due = pacer.due(seq, total).await;
            while seq < due {
                let Some(payload) = payloads.next() else {
                    break;
                };
                sent_ns.push(nanos_since(origin));
                match &self.jetstream {
                    None => {
                        let sent = match &self.headers {
                            None => self.client.publish(self.subject.clone(), payload).await,
                            Some(headers) => {
                                let (subject, headers) = (self.subject.clone(), headers.clone());
                                self.client
                                    .publish_with_headers(subject, headers, payload)
                                    .await
                            }
                        };
                        if let Err(e) = sent {
                            errors.add(format!("publish: {e}"));
                        }
                    }
                    Some(js) => {
                        let sent = match &self.headers {
                            None => js.publish(self.subject.clone(), payload).await,
                            Some(headers) => {
                                let (subject, headers) = (self.subject.clone(), headers.clone());
                                js.publish_with_headers(subject, headers, payload).await
                            }
                        };
                        match sent {
                            Ok(ack) => acks.push(ack.into_future()),
                            Err(e) => errors.add(format!("JetStream publish: {e}")),
                        }
                        while let Some(Some(result)) = acks.next().now_or_never() {
                            note_ack(result, &mut errors);
                        }
                        while acks.len() >= self.concurrency {
                            if let Some(result) = acks.next().await {
                                note_ack(result, &mut errors);
                            }
                        }
                    }
                }
                seq += 1;
                progress.sent.store(seq as u64, Ordering::Relaxed);
            }
        }
        while let Some(result) = acks.next().await {
            note_ack(result, &mut errors);
        }
        if let Err(e) = self.client.flush().await {
            errors.add(format!("flush: {e}"));
        }
        errors
    }
}

fn note_ack(
    result: Result<
        async_nats::jetstream::publish::PublishAck,
        async_nats::jetstream::context::PublishError,
    >,
    errors: &mut PublishErrors,
) {
    if let Err(e) = result {
        errors.add(format!("JetStream ack: {e}"));
    }
}

/// Paces by the clock, not by sleeping per message: at each millisecond tick
/// every message whose time has come is sent, so the average rate is exact
/// even though the timer is coarser than the gap between messages.
struct Pacer {
    rate: f64,
    start: Option<Instant>,
    tick: tokio::time::Interval,
}

impl Pacer {
    fn new(rate: f64) -> Pacer {
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Pacer {
            rate,
            start: None,
            tick,
        }
    }

    /// How many messages may have been sent by now (more than `sent`; waits
    /// for the next tick until then). The first is due at once.
    async fn due(&mut self, sent: usize, total: usize) -> usize {
        if self.rate <= 0.0 {
            return total;
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        loop {
            let due = due_after(start.elapsed(), self.rate);
            if due > sent {
                return due.min(total);
            }
            self.tick.tick().await;
        }
    }
}

/// How many messages are due `elapsed` after the first at `rate` per second:
/// message k (from 0) is due at k / rate, never before.
fn due_after(elapsed: Duration, rate: f64) -> usize {
    (elapsed.as_secs_f64() * rate) as usize + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pacer never sends early (checked on the arithmetic, not on a
    /// clock): at 400/s message k is due at k x 2.5 ms, not a microsecond
    /// sooner, so the 400th goes out no earlier than 997.5 ms.
    #[test]
    fn a_message_is_never_due_before_its_time() {
        let rate = 400.0;
        assert_eq!(due_after(Duration::ZERO, rate), 1, "the first at once");
        for k in 1..400u64 {
            let at = Duration::from_micros(k * 2_500);
            assert_eq!(due_after(at - Duration::from_micros(1), rate), k as usize);
            // Float rounding may make it a hair late, never early.
            assert_eq!(
                due_after(at + Duration::from_micros(1), rate),
                k as usize + 1
            );
        }
    }
}
