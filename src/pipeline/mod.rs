//! The pipeline: one delivery, from either transport, through
//! decode → decide → publish → settle. Both delivery modes run this one path;
//! what differs between them is in [`crate::transport`]
//! (how a delivery is settled, how an output is confirmed).
//!
//! - here: [`Pipeline::handle`], where a delivery starts and ends.
//! - [`decide`]: the header block checked, then the decision, large inputs
//!   beside the runtime.
//!   Headers, read and written, are [`crate::headers`]'.
//! - [`settle`]: the pure rules: ack, term, or nak with backoff.
//! - `fallback.rs`: the dead letters that stand in for an output that cannot
//!   go out (too large, invalid subject) and for a result the byte budget
//!   refused.
//! - `log.rs`: the one outcome log.
//! - `side.rs`: what goes out beside the one output: the KV release notice
//!   of a refused handoff, `Nats-TTL` on a decode job with a deadline.
//! - [`gen_gate`]: a GEN stream that refuses decode jobs (full, discard
//!   `new`): their results held, one probe at a time, until it has room.
//! - [`cancels`]: the cancel subject every worker listens on, and the
//!   cancels a JetStream stream kept, into the set the decision asks.
//! - [`run`]: the runner: bounded in-flight work and drain, for both modes.
//! - [`serve`]: wires a configuration to a source, a sink and the runner.
//! - [`shutdown`], [`stats`]: SIGTERM/SIGINT, and counts for the report.

pub mod cancels;
pub mod decide;
mod fallback;
pub mod gen_gate;
mod log;
mod refuse;
pub mod run;
pub mod serve;
pub mod settle;
pub mod shutdown;
mod side;
pub mod stats;

pub use run::{Options, Report, Runner};
pub use stats::{Counts, Stats};

use crate::cancel::Cancellations;
use crate::decision::{DeadLetterCode, Decision, Input, Outcome, Rules, deadline};
use crate::headers::names::{CONTENT_TYPE, HANDOFF_DEADLINE, HANDOFF_KV_EXPIRES};
use crate::headers::{self, TraceHeaders};
use crate::identity::Identity;
use crate::metrics::{Metrics, NakReason};
use crate::redelivery::Redelivery;
use crate::telemetry::{Arrival, ResultSpan, Telemetry};
use crate::transport::{Delivery, Outbox, PublishError, Settle, Sink, Target};
use crate::wire::Encoding;
use async_nats::HeaderMap;
use bytes::Bytes;
use settle::Plan;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

/// What happened to one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// Its one output is published (confirmed, in durable mode) and the
    /// delivery acked or terminated.
    Published(Outcome),
    /// No output: it needs an ID while the worker holds no slot, and the
    /// transport will deliver it again.
    Deferred(Outcome),
    /// Its output could not be published; logged and counted (and asked
    /// for again, where the transport can redeliver).
    Failed(Outcome),
    /// Its output is in the batch's outbox (core mode): published once the
    /// outbox is sent, which is when it is counted ([`Queued::count`]).
    Queued(Queued),
}

/// A result whose output waits in an outbox: what its count needs. A
/// result published at once is counted through it too, as gone out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    pub outcome: Outcome,
    trailing_frames: usize,
    received_at: std::time::Instant,
}

impl Queued {
    /// Counts the result once its output's fate is known: recorded as
    /// published when it went out, as failed when it was lost with the
    /// client. Returns the result as either.
    pub fn count(self, metrics: &Metrics, went_out: bool) -> Handled {
        if went_out {
            let latency = self.received_at.elapsed();
            metrics.record(&self.outcome, self.trailing_frames, latency);
            Handled::Published(self.outcome)
        } else {
            metrics.publish_failed();
            Handled::Failed(self.outcome)
        }
    }
}

/// Where decode jobs go when GEN is a stream (durable mode only).
#[derive(Debug, Clone)]
pub struct GenStream {
    pub name: String,
    /// Its duplicate window as the server holds it.
    pub duplicate_window: Duration,
    /// Whether it expires messages by their `Nats-TTL` header (nats-server
    /// 2.11 and later, `allow_msg_ttl`): decode jobs with a deadline then
    /// leave it at their deadline.
    pub msg_ttl: bool,
}

impl GenStream {
    /// Whether a decode job first handled at `stored_at` (the prefill
    /// result's store time) may have left the duplicate window by now. Half
    /// the window: a margin for the clocks of server and worker.
    fn may_have_forgotten(&self, stored_at: time::OffsetDateTime) -> bool {
        let age = time::OffsetDateTime::now_utc() - stored_at;
        age >= self.duplicate_window / 2
    }
}

/// When a delivery's result was published, Unix epoch milliseconds: the
/// stream's stored time where there is one (JetStream), else when it was
/// received (`now_ms` less the time it waited here).
fn published_ms(delivery: &Delivery, now_ms: u64) -> u64 {
    match delivery.attempt.stored_at {
        Some(stored_at) => {
            let ms = stored_at.unix_timestamp_nanos() / 1_000_000;
            u64::try_from(ms).unwrap_or(0)
        }
        None => {
            let waited = delivery.received_at.elapsed().as_millis();
            now_ms.saturating_sub(u64::try_from(waited).unwrap_or(u64::MAX))
        }
    }
}

/// Everything a delivery needs, shared by all in flight.
pub struct Pipeline {
    pub rules: Rules,
    pub identity: Identity,
    pub metrics: Metrics,
    pub sink: Sink,
    /// Backoff and delivery limit, for deliveries the transport can
    /// deliver again; others are [`Redelivery::AT_MOST_ONCE`].
    pub redelivery: Redelivery,
    /// Decode jobs are published into this stream and wait for its ack.
    pub gen_stream: Option<GenStream>,
    /// Holds decode jobs while the GEN stream refuses them.
    pub gen_gate: Arc<gen_gate::GenGate>,
    /// How long the late-redelivery lookup in GEN may take.
    pub lookup_bound: Duration,
    /// Each delivery's span (`crate::telemetry`); `None`: no tracing, and
    /// no span built.
    pub telemetry: Option<Telemetry>,
    /// The cancels this worker holds, which the decision asks, and the
    /// decode jobs it sent lately.
    pub cancellations: Arc<Cancellations>,
}

impl Pipeline {
    /// Takes one delivery to its end: decided, its one output published,
    /// settled. Never panics on the message's content.
    ///
    /// The one place a delivery starts and ends, in both modes: its trace
    /// span (`crate::telemetry`) starts here, at delivery, and ends after
    /// settling; the output's `traceparent` names it, and log lines inside
    /// carry its IDs.
    ///
    /// Given a core-mode batch's `outbox`, the output is put in it and the
    /// result comes back [`Handled::Queued`]: the caller sends the outbox
    /// and counts it. Without one (JetStream mode), the output is out (or
    /// not) when this returns, and counted.
    pub async fn handle(&self, delivery: Box<Delivery>, outbox: Option<&mut Outbox>) -> Handled {
        let mut trace = TraceHeaders::read(delivery.headers.as_ref());
        let arrival = Arrival {
            subject: &delivery.subject,
            size: delivery.payload.len(),
            attempt: delivery.attempt.number,
        };
        let mut span = Telemetry::result(
            self.telemetry.as_ref(),
            &trace,
            arrival,
            delivery.received_at,
        );
        span.propagate(&mut trace);
        let log = span.log_span();
        self.handle_traced(delivery, trace, &mut span, outbox)
            .instrument(log)
            .await
    }

    async fn handle_traced(
        &self,
        delivery: Box<Delivery>,
        trace: TraceHeaders,
        span: &mut ResultSpan,
        mut outbox: Option<&mut Outbox>,
    ) -> Handled {
        let _in_flight = self.metrics.in_flight();
        let attempt = delivery.attempt.number;
        if attempt > 1 {
            self.metrics.redelivered();
        }
        let now_ms = crate::clock::unix_ms();
        let mut decision = self.decision_for(&delivery, now_ms).await;
        span.decided(&decision);
        let done = match settle::plan(&decision.outcome, attempt, &self.redelivery_of(&delivery)) {
            Plan::Retry(delay) => {
                self.defer(&delivery, &decision, delay, span).await;
                return Handled::Deferred(decision.outcome);
            }
            Plan::Publish(done) => done,
        };

        self.metrics.trace_headers_dropped(&trace.dropped);
        let release = decision.release.take();
        self.expire_at_deadline(&mut decision, now_ms);
        let outgoing = headers::outgoing(std::mem::take(&mut decision.headers), &trace);
        let payload = Bytes::from(std::mem::take(&mut decision.payload));
        let output_size = payload.len();
        let queued = outbox.is_some();
        let publish = self.publish(
            &delivery,
            &decision,
            outgoing,
            payload,
            outbox.as_deref_mut(),
        );
        let (outcome, done) = match delivery.while_pending(publish).await {
            Ok(()) => {
                span.published(&decision.outcome, &decision.subject, output_size);
                self.job_left(&decision);
                if let Some(release) = release {
                    Box::pin(self.publish_release(*release, &decision, &trace)).await;
                }
                (decision.outcome.clone(), done)
            }
            // A decode job held for a refusing GEN until its KV expired or
            // its deadline passed: decided again, now (it is answered
            // `kv_expired` or `deadline_exceeded`, with its release notice).
            Err(PublishError::Expired { .. }) => {
                return Box::pin(self.handle_traced(delivery, trace, span, outbox)).await;
            }
            // The failure paths are boxed: rare, and inline they would grow
            // every result's future.
            Err(e) => {
                let instead = self.not_published(&delivery, &trace, &decision, e, outbox, span);
                match Box::pin(instead).await {
                    Ok(done) => done,
                    Err(handled) => return handled,
                }
            }
        };

        log::outcome(&outcome, &decision, &delivery.subject, attempt);
        delivery.settle(done).await;
        settled(span, &delivery, done);
        let out = Queued {
            outcome,
            trailing_frames: decision.trailing_frames,
            received_at: delivery.received_at,
        };
        if queued {
            // Counted once the outbox is sent.
            return Handled::Queued(out);
        }
        out.count(&self.metrics, true)
    }

    /// How a delivery may be delivered again: not at all where its
    /// transport cannot.
    fn redelivery_of(&self, delivery: &Delivery) -> Redelivery {
        if delivery.redeliverable() {
            self.redelivery
        } else {
            Redelivery::AT_MOST_ONCE
        }
    }

    /// The decision for a delivery: its encoding from its `content-type`,
    /// its header block checked, then the decision ([`decide::decide_received`]).
    async fn decision_for(&self, delivery: &Delivery, now_ms: u64) -> Decision {
        let incoming: Option<&HeaderMap> = delivery.headers.as_ref();
        let input = Input {
            payload: &delivery.payload,
            encoding: Encoding::from_content_type(headers::first(incoming, CONTENT_TYPE)),
            subject: &delivery.subject,
            nats_reply: delivery.reply.as_deref(),
            deadline_header: headers::first(incoming, HANDOFF_DEADLINE),
            kv_expires_header: headers::first(incoming, HANDOFF_KV_EXPIRES),
            now_ms,
            published_ms: published_ms(delivery, now_ms),
            cancels: &*self.cancellations,
        };
        let decision =
            decide::decide_received(input, incoming, &self.rules, &mut &self.identity).await;
        if let Some(deadline) = decision.deadline_ms {
            let left = Duration::from_millis(deadline.saturating_sub(now_ms));
            self.metrics.deadline_remaining(left);
        }
        decision
    }

    /// A result that needs a request ID while no slot is held, and may be
    /// delivered again: nothing is published, redelivery is asked for after
    /// `delay`.
    async fn defer(
        &self,
        delivery: &Delivery,
        decision: &Decision,
        delay: Duration,
        span: &mut ResultSpan,
    ) {
        tracing::debug!(
            request_id = decision.request_id.as_deref(),
            attempt = delivery.attempt.number,
            delay_ms = delay.as_millis() as u64,
            "no machine-ID slot to mint with; asking for redelivery"
        );
        self.metrics.nacked(NakReason::IdentityUnavailable);
        delivery.settle(Settle::Nak(delay)).await;
        span.not_published(&decision.outcome, "no slot held: redelivery asked for");
        span.settled("nak");
    }

    /// Publishes the decision's output: decode jobs into the GEN stream when
    /// it is one, everything else onto its subject.
    async fn publish(
        &self,
        delivery: &Delivery,
        decision: &Decision,
        headers: HeaderMap,
        payload: Bytes,
        outbox: Option<&mut Outbox>,
    ) -> Result<(), PublishError> {
        let decode = matches!(decision.outcome, Outcome::Decode { .. });
        let Some(gen_stream) = self.gen_stream.as_ref().filter(|_| decode) else {
            return self
                .sink
                .publish(&decision.subject, headers, payload, Target::Subject, outbox)
                .await;
        };
        // A decode job redelivered after its first copy may have left the
        // GEN stream's duplicate window (workers were away longer than the
        // window, so the redelivery came late): Nats-Msg-Id would no longer
        // drop a second copy, so look for the first one before publishing.
        if let (Sink::JetStream(sink), Some(stored_at)) = (&self.sink, delivery.attempt.stored_at)
            && delivery.attempt.number > 1
            && gen_stream.may_have_forgotten(stored_at)
        {
            // As the decision set it (its headers moved into `headers`).
            let msg_id = headers::msg_id(decision.request_id.as_deref().unwrap_or_default());
            let msg_id = msg_id.as_str();
            // Boxed: rare, and inline it would more than double every
            // result's future (moved several times per result).
            let held = Box::pin(sink.holds(
                &gen_stream.name,
                &decision.subject,
                msg_id,
                stored_at,
                self.lookup_bound,
            ))
            .await?;
            if held {
                tracing::info!(
                    request_id = decision.request_id.as_deref(),
                    attempt = delivery.attempt.number,
                    "late redelivery: the GEN stream already holds this decode job"
                );
                return Ok(());
            }
        }
        // Held for a refusing GEN at most until the job would be refused.
        let skew = self.rules.deadline_skew_ms;
        let refused_at = decision.deadline_ms.map(|ms| ms.saturating_add(skew));
        let good_until = deadline::earliest(decision.kv_expires_ms, refused_at);
        self.store_decode_job(&decision.subject, headers, payload, good_until)
            .await
    }

    /// The output did not go out (`e`). One that can never be sent (too
    /// large, a subject the client refuses) is replaced by the input's dead
    /// letter: `Ok` with that outcome and its settlement. Otherwise, or when
    /// the dead letter fails too, the one failure path ([`Pipeline::failed`]):
    /// `Err` with what was handled.
    async fn not_published(
        &self,
        delivery: &Delivery,
        trace: &TraceHeaders,
        decision: &Decision,
        e: PublishError,
        outbox: Option<&mut Outbox>,
        span: &mut ResultSpan,
    ) -> Result<(Outcome, Settle), Handled> {
        let Some(code) = fallback_code(&e) else {
            return Err(self.failed(delivery, decision, e, span).await);
        };
        match self
            .dead_letter_instead(delivery, trace, decision, code, &e, outbox)
            .await
        {
            Ok(()) => {
                let outcome = Outcome::DeadLetter { code };
                let subject = &self.rules.dead_letter_subject;
                span.published(&outcome, subject, delivery.payload.len());
                Ok((outcome, Settle::Term))
            }
            Err(e) => Err(self.failed(delivery, decision, e, span).await),
        }
    }

    /// Publishes a decode job into the GEN stream and waits for its store
    /// ack; while GEN refuses it (full), holds it and tries again
    /// ([`gen_gate`]) until the worker stops, which hands it back as
    /// refused, or until `good_until` (Unix ms), which gives it up as
    /// [`PublishError::Expired`]. Durable mode only: no outbox.
    async fn store_decode_job(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
        good_until: Option<u64>,
    ) -> Result<(), PublishError> {
        // A millisecond past it by the wall clock, which the decision that
        // follows reads: then it refuses the job.
        let expires_at = good_until.map(|ms| {
            let left = ms.saturating_sub(crate::clock::unix_ms()) + 1;
            tokio::time::Instant::now() + Duration::from_millis(left)
        });
        loop {
            let pass = match expires_at {
                Some(at) => match tokio::time::timeout_at(at, self.gen_gate.pass()).await {
                    Ok(pass) => pass,
                    Err(_) => {
                        return Err(PublishError::Expired {
                            subject: subject.to_string(),
                        });
                    }
                },
                None => self.gen_gate.pass().await,
            };
            let Ok(pass) = pass else {
                return Err(PublishError::Refused {
                    subject: subject.to_string(),
                    reason: "held while GEN refused decode jobs, and the worker is stopping".into(),
                });
            };
            // Cloned for a try after a refusal: the publish takes them.
            let stored = self
                .sink
                .publish(
                    subject,
                    headers.clone(),
                    payload.clone(),
                    Target::Stream,
                    None,
                )
                .await;
            match stored {
                Ok(()) => {
                    self.gen_gate.stored(pass);
                    return Ok(());
                }
                Err(PublishError::Refused { reason, .. }) => self.gen_gate.refused(pass, &reason),
                Err(e) => return Err(e),
            }
        }
    }

    /// The one failure path: the output (or its dead letter) is not known to
    /// be out. Redelivered later where the transport can; otherwise, or
    /// when it can never be published, this result has no output.
    async fn failed(
        &self,
        delivery: &Delivery,
        decision: &Decision,
        e: PublishError,
        span: &mut ResultSpan,
    ) -> Handled {
        self.metrics.publish_failed();
        span.not_published(&decision.outcome, &e.to_string());
        let request_id = decision.request_id.as_deref();
        let attempt = delivery.attempt.number;
        let permanent = matches!(
            e,
            PublishError::TooLarge(_) | PublishError::InvalidSubject { .. }
        );
        if permanent || !delivery.redeliverable() {
            tracing::error!(
                kind = decision.outcome.kind(),
                ?request_id,
                source = %delivery.subject,
                error = %e,
                "could not publish the output; this result has none"
            );
            delivery.settle(Settle::Term).await;
            settled(span, delivery, Settle::Term);
            return Handled::Failed(decision.outcome.clone());
        }
        let delay = self.redelivery.delay(attempt);
        tracing::warn!(
            ?request_id,
            attempt,
            last_delivery = self.redelivery.is_last(attempt),
            error = %e,
            "output not confirmed; asking for redelivery"
        );
        self.metrics.nacked(NakReason::PublishFailed);
        delivery.settle(Settle::Nak(delay)).await;
        settled(span, delivery, Settle::Nak(delay));
        Handled::Failed(decision.outcome.clone())
    }
}

/// Records the settlement on the span; core NATS has nothing to settle.
fn settled(span: &mut ResultSpan, delivery: &Delivery, settle: Settle) {
    if delivery.redeliverable() {
        span.settled(match settle {
            Settle::Ack => "ack",
            Settle::Term => "term",
            Settle::Nak(_) => "nak",
        });
    }
}

/// The dead letter that stands in for an output that can never be
/// published; `None` when a later try may succeed. Both modes dead-letter
/// an invalid reply subject, so that even such an input has its one output.
fn fallback_code(e: &PublishError) -> Option<DeadLetterCode> {
    match e {
        PublishError::TooLarge(_) => Some(DeadLetterCode::TooLarge),
        PublishError::InvalidSubject { .. } => Some(DeadLetterCode::ReplyToNotAllowed),
        PublishError::Failed { .. }
        | PublishError::Refused { .. }
        | PublishError::Expired { .. } => None,
    }
}
