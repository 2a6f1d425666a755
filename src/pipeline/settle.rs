//! How a delivery is settled once its decision is known: the pure rules, so
//! every one has a table test. An at-most-once transport (core NATS) is
//! [`Redelivery::AT_MOST_ONCE`]: every delivery is its last, so every result
//! is answered at once and nothing is retried.
//!
//! - An output is published first; only then is the message acked (or
//!   terminated, for dead letters: undecodable input is never redelivered).
//! - A result that needs a request ID while this worker holds no valid slot
//!   is not answered: it is nak'd with a growing delay, so that it completes
//!   once an identity is back (here or on another worker). Only on the last
//!   delivery `max_deliver` allows is the `identity_unavailable` error
//!   published, so that the request still gets its one output instead of
//!   silently stopping at the delivery limit.
//! - A failed publish is nak'd with the same growing delay.

use crate::decision::{ErrorCode, Outcome};
use crate::transport::Settle;
use std::time::Duration;

/// The redelivery settings, from `jetstream.*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redelivery {
    /// The first nak delay (`jetstream.nak_delay_ms`).
    pub nak_delay: Duration,
    /// The delivery limit (`jetstream.max_deliver`); -1 means none.
    pub max_deliver: i64,
}

impl Redelivery {
    /// No redelivery: each delivery is the only one.
    pub const AT_MOST_ONCE: Redelivery = Redelivery {
        nak_delay: Duration::ZERO,
        max_deliver: 1,
    };
}

/// Nak delays double per delivery up to this multiple of the first one.
pub const MAX_BACKOFF_FACTOR: u32 = 32;

impl Redelivery {
    /// The nak delay after the `delivered`-th delivery (1 = first):
    /// `nak_delay × 2^(delivered-1)`, at most `nak_delay × 32`.
    pub fn delay(&self, delivered: i64) -> Duration {
        let doublings = delivered.saturating_sub(1).clamp(0, 5) as u32;
        let factor = (1u32 << doublings).min(MAX_BACKOFF_FACTOR);
        self.nak_delay.saturating_mul(factor)
    }

    /// The longest time from a message's first publish of an output to its
    /// last possible re-publish: every delivery may be held for `ack_wait`
    /// (the publish can happen at its very end) and each but the last may
    /// be followed by its nak delay. `None` without a delivery limit: the
    /// span is unbounded. Defaults (30 s, 20 deliveries, 1 s): 20 × 30 s +
    /// (1 + 2 + 4 + 8 + 16 + 14 × 32) s = 1079 s.
    pub fn span(&self, ack_wait: Duration) -> Option<Duration> {
        if self.max_deliver <= 0 {
            return None;
        }
        let holds = ack_wait.saturating_mul(u32::try_from(self.max_deliver).unwrap_or(u32::MAX));
        let naks = (1..self.max_deliver.min(i64::from(u32::MAX)))
            .map(|delivered| self.delay(delivered))
            .fold(Duration::ZERO, Duration::saturating_add);
        Some(holds.saturating_add(naks))
    }

    /// Whether the server will not deliver the message again after this delivery.
    pub fn is_last(&self, delivered: i64) -> bool {
        self.max_deliver > 0 && delivered >= self.max_deliver
    }
}

/// What to do with a message once decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Publish the decision's message, then settle the delivery so (ack,
    /// or term for dead letters: undecodable input is never redelivered).
    Publish(Settle),
    /// Publish nothing; ask for redelivery after the delay.
    Retry(Duration),
}

/// The plan for a decided message on its `delivered`-th delivery.
pub fn plan(outcome: &Outcome, delivered: i64, redelivery: &Redelivery) -> Plan {
    match outcome {
        Outcome::Error {
            code: ErrorCode::IdentityUnavailable,
        } if !redelivery.is_last(delivered) => Plan::Retry(redelivery.delay(delivered)),
        Outcome::DeadLetter { .. } => Plan::Publish(Settle::Term),
        _ => Plan::Publish(Settle::Ack),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{Backend, DeadLetterCode, FinishReason};

    const R: Redelivery = Redelivery {
        nak_delay: Duration::from_millis(100),
        max_deliver: 5,
    };
    const UNLIMITED: Redelivery = Redelivery {
        nak_delay: Duration::from_millis(100),
        max_deliver: -1,
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn plans_follow_the_contract() {
        let unavailable = Outcome::Error {
            code: ErrorCode::IdentityUnavailable,
        };
        let rows: &[(Outcome, i64, Redelivery, Plan)] = &[
            (
                Outcome::Decode {
                    backend: Backend::Trtllm,
                    minted: true,
                },
                1,
                R,
                Plan::Publish(Settle::Ack),
            ),
            (
                Outcome::Terminal {
                    finish_reason: FinishReason::Stop,
                },
                1,
                R,
                Plan::Publish(Settle::Ack),
            ),
            (
                Outcome::Error {
                    code: ErrorCode::MissingCtxRequestId,
                },
                1,
                R,
                Plan::Publish(Settle::Ack),
            ),
            (
                Outcome::DeadLetter {
                    code: DeadLetterCode::Malformed,
                },
                1,
                R,
                Plan::Publish(Settle::Term),
            ),
            (
                Outcome::DeadLetter {
                    code: DeadLetterCode::ReplyToNotAllowed,
                },
                3,
                R,
                Plan::Publish(Settle::Term),
            ),
            // Fenced: wait and retry, with a growing delay.
            (unavailable.clone(), 1, R, Plan::Retry(ms(100))),
            (unavailable.clone(), 2, R, Plan::Retry(ms(200))),
            (unavailable.clone(), 4, R, Plan::Retry(ms(800))),
            // The last delivery the consumer allows: answer with the error.
            (unavailable.clone(), 5, R, Plan::Publish(Settle::Ack)),
            (unavailable.clone(), 9, R, Plan::Publish(Settle::Ack)),
            // No delivery limit: retry forever, the delay capped.
            (unavailable.clone(), 50, UNLIMITED, Plan::Retry(ms(3200))),
            // At most once (core NATS): no second delivery to wait for, so
            // the error is the answer, and a dead letter is still terminal.
            (
                unavailable.clone(),
                1,
                Redelivery::AT_MOST_ONCE,
                Plan::Publish(Settle::Ack),
            ),
            (
                Outcome::DeadLetter {
                    code: DeadLetterCode::Malformed,
                },
                1,
                Redelivery::AT_MOST_ONCE,
                Plan::Publish(Settle::Term),
            ),
        ];
        for (i, (outcome, delivered, redelivery, expected)) in rows.iter().enumerate() {
            assert_eq!(
                plan(outcome, *delivered, redelivery),
                *expected,
                "row {i}: {outcome:?} on delivery {delivered}"
            );
        }
    }

    #[test]
    fn span_covers_every_hold_and_every_nak_delay() {
        let ms = Duration::from_millis;
        let limited = |max_deliver| Redelivery {
            nak_delay: ms(1000),
            max_deliver,
        };
        let ack_wait = Duration::from_secs(30);
        assert_eq!(limited(1).span(ack_wait), Some(ack_wait));
        assert_eq!(limited(3).span(ack_wait), Some(ms(90_000 + 1000 + 2000)));
        assert_eq!(
            limited(20).span(ack_wait),
            Some(Duration::from_secs(600 + 31 + 14 * 32))
        );
        assert_eq!(UNLIMITED.span(ack_wait), None);
    }

    #[test]
    fn delay_doubles_then_caps() {
        let got: Vec<u64> = (0..=9)
            .map(|d| UNLIMITED.delay(d).as_millis() as u64)
            .collect();
        assert_eq!(
            got,
            vec![100, 100, 200, 400, 800, 1600, 3200, 3200, 3200, 3200]
        );
        assert_eq!(UNLIMITED.delay(i64::MAX), ms(3200));
        assert_eq!(UNLIMITED.delay(i64::MIN), ms(100));
    }

    #[test]
    fn last_delivery() {
        assert!(!R.is_last(4));
        assert!(R.is_last(5));
        assert!(!UNLIMITED.is_last(i64::MAX));
    }
}
