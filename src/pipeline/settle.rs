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
use crate::redelivery::Redelivery;
use crate::transport::Settle;
use std::time::Duration;

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
}
