//! Core mode's answer to a result the byte budget had no room for: not
//! decided, but not lost either. Its one output is a dead letter
//! `over_budget` carrying its bytes; its client, when the first few KiB name
//! an allowed reply subject, is also told (`over_budget`, retryable).
//!
//! The dead letter carries the buffer the bytes arrived in (no copy), and
//! the runner reads on at once: waiting until each was written held the
//! whole burst in the client instead, since the server holds back a
//! publisher whose subscribers lag. What bounds memory is an allowance:
//! refused bytes handed to the client and not yet written stay under
//! [`Refusals::allowance`]; past it a dead letter goes without its bytes
//! (saying how many) and only the notice tells the client to retry.

use super::{Handled, Pipeline};
use crate::decision::{self, DeadLetterCode, ErrorCode, Outcome};
use crate::headers::{self, TraceHeaders, names::CONTENT_TYPE};
use crate::metrics::RateLimitedLog;
use crate::transport::{Delivery, PublishError, Settle, Target};
use crate::wire::peek::{self, ReplyTo};
use crate::wire::{self, Encoding, messages};
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The runner's over-budget refusals: their log, and the refused bytes the
/// NATS client has not written yet.
pub struct Refusals {
    log: RateLimitedLog,
    unwritten: Arc<AtomicUsize>,
    allowance: usize,
}

impl Refusals {
    /// `allowance`: how many refused bytes may wait in the client at once;
    /// one refused result of any size allowed is always carried.
    pub fn new(allowance: usize) -> Refusals {
        Refusals {
            log: RateLimitedLog::default(),
            unwritten: Arc::default(),
            allowance,
        }
    }

    pub fn allowance(&self) -> usize {
        self.allowance
    }

    /// `payload` as a buffer counted until the client drops it (written, or
    /// refused), when the allowance has room for it; `None` otherwise.
    fn carry(&self, payload: &Bytes) -> Option<Bytes> {
        let n = payload.len();
        let fits = |held: usize| held == 0 || held + n <= self.allowance;
        self.unwritten
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                fits(held).then_some(held + n)
            })
            .ok()?;
        Some(Bytes::from_owner(Unwritten {
            bytes: payload.clone(),
            count: Arc::clone(&self.unwritten),
        }))
    }
}

/// A refused result's bytes on their way out: the same buffer, counted in
/// [`Refusals`] until the client lets go of it.
struct Unwritten {
    bytes: Bytes,
    count: Arc<AtomicUsize>,
}

impl AsRef<[u8]> for Unwritten {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Unwritten {
    fn drop(&mut self) {
        self.count.fetch_sub(self.bytes.len(), Ordering::AcqRel);
    }
}

impl Pipeline {
    /// Answers a result the byte budget had no room for, without deciding
    /// it: a dead letter `over_budget` with the input's bytes while
    /// [`Refusals`] has room for them (without them, saying how many,
    /// otherwise), and an `over_budget` error response to its client when
    /// one can be named. Counted in
    /// `handoff_dead_letters_total{code="over_budget"}` (the notice in
    /// `handoff_error_responses_total{code="over_budget"}`), logged at most
    /// once per 10 s with the count.
    pub async fn refuse_over_budget(
        &self,
        delivery: Box<Delivery>,
        bytes: usize,
        held: usize,
        max_in_flight_bytes: usize,
        refusals: &Refusals,
    ) -> Handled {
        let why = format!(
            "the worker held {held} bytes of results (max_in_flight_bytes {max_in_flight_bytes}) and had no room for this one's {bytes} bytes; it was not decided"
        );
        let trace = TraceHeaders::read(delivery.headers.as_ref());
        self.metrics.trace_headers_dropped(&trace.dropped);
        let outcome = Outcome::DeadLetter {
            code: DeadLetterCode::OverBudget,
        };
        let carried = refusals.carry(&delivery.payload);
        let without = carried.is_none();
        let dead = self.over_budget_dead_letter(&delivery, carried, &trace, &why);
        let handled = match dead.await {
            Ok(()) => {
                self.metrics
                    .record(&outcome, 0, delivery.received_at.elapsed());
                delivery.settle(Settle::Term).await;
                Handled::Published(outcome)
            }
            Err(e) => {
                self.metrics.publish_failed();
                tracing::error!(source = %delivery.subject, error = %e, "could not publish an over_budget dead letter; this result has no output");
                Handled::Failed(outcome)
            }
        };
        self.tell_over_budget(&delivery, &trace, &why).await;
        if let Some(refused) = refusals.log.due(Instant::now()) {
            tracing::warn!(
                refused,
                held,
                max_in_flight_bytes,
                last_without_bytes = without,
                "results refused: the worker's byte budget is spent; each got an over_budget dead letter (with its bytes while the dead letters before it were written) and its client an over_budget error when named. Add workers, raise max_in_flight_bytes (and the memory limit), or use jetstream mode"
            );
        }
        handled
    }

    /// The dead letter, with `carried` (the input's bytes) when given;
    /// without them (saying how many) when not, or when they and the
    /// headers do not fit the server.
    async fn over_budget_dead_letter(
        &self,
        delivery: &Delivery,
        carried: Option<Bytes>,
        trace: &TraceHeaders,
        why: &str,
    ) -> Result<(), PublishError> {
        let set = decision::dead_letter_headers(DeadLetterCode::OverBudget, why, &delivery.subject);
        if let Some(payload) = carried {
            let whole = self.dead_letter(&set, trace, payload, None);
            match delivery.while_pending(whole).await {
                Err(PublishError::TooLarge(_)) => {}
                other => return other,
            }
        }
        let set = decision::without_payload(&set, delivery.payload.len());
        let bare = self.dead_letter(&set, trace, Bytes::new(), None);
        delivery.while_pending(bare).await
    }

    /// The `over_budget` error response to the client, when the first few
    /// KiB name its reply subject (`reply_to`, or in core mode the NATS
    /// reply subject of a body that names none so far) and that subject
    /// passes the reply policy. A side output: its failure is logged and
    /// counted, and changes nothing else.
    async fn tell_over_budget(&self, delivery: &Delivery, trace: &TraceHeaders, why: &str) {
        let content_type = headers::first(delivery.headers.as_ref(), CONTENT_TYPE);
        let encoding = Encoding::from_content_type(content_type);
        let peeked = peek::peek(&delivery.payload, encoding);
        let subject = match (peeked.reply_to(), &delivery.reply) {
            (ReplyTo::Found(subject), _) => subject,
            (ReplyTo::NotSeen, Some(reply)) if self.rules.use_nats_reply => reply.to_string(),
            _ => return,
        };
        if let Err(refusal) = self.rules.reply_policy.check(&subject) {
            tracing::debug!(%refusal, "an over_budget result's reply subject is not allowed; only its dead letter goes out");
            return;
        }
        let code = ErrorCode::OverBudget;
        let message = format!("{why}; retry with backoff");
        let body =
            messages::error_response(peeked.request_id().as_deref(), code.as_str(), &message);
        let headers = headers::outgoing(decision::content_type(encoding), trace);
        let payload = Bytes::from(wire::encode(&body, encoding));
        let sent = self
            .sink
            .publish(&subject, headers, payload, Target::Subject, None)
            .await;
        match sent {
            Ok(()) => self.metrics.side_error(code),
            Err(e) => {
                self.metrics.publish_failed();
                tracing::warn!(%subject, error = %e, "could not send an over_budget error response");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowance_carries_refused_bytes_until_the_client_lets_go() {
        let refusals = Refusals::new(10);
        let input = Bytes::from(vec![7u8; 6]);
        let first = refusals.carry(&input).expect("room for the first");
        assert_eq!(first, input, "the same bytes");
        assert!(refusals.carry(&input).is_none(), "6 + 6 is over 10");
        let small = Bytes::from(vec![1u8; 4]);
        let second = refusals.carry(&small).expect("6 + 4 fits");
        drop(first);
        let third = refusals.carry(&input).expect("room again once written");
        drop((second, third));
        assert_eq!(refusals.unwritten.load(Ordering::Acquire), 0);
    }

    #[test]
    fn one_result_larger_than_the_allowance_is_still_carried_alone() {
        let refusals = Refusals::new(4);
        let big = Bytes::from(vec![0u8; 16]);
        let carried = refusals.carry(&big).expect("alone, it goes");
        assert!(refusals.carry(&Bytes::from_static(b"x")).is_none());
        drop(carried);
        assert!(refusals.carry(&Bytes::from_static(b"x")).is_some());
    }

    #[test]
    fn carrying_does_not_copy() {
        let refusals = Refusals::new(1 << 20);
        let input = Bytes::from(vec![3u8; 1024]);
        let carried = refusals.carry(&input).unwrap();
        assert_eq!(carried.as_ptr(), input.as_ptr());
    }
}
