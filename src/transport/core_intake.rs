//! The core source's intake: takes every result off the subscriptions as
//! soon as it arrives and holds its bytes in the worker's byte budget
//! (`max_in_flight_bytes`), or refuses it when the budget is spent.
//!
//! Reading is not gated on free in-flight slots: a result waiting for a slot
//! waits here, in bytes the budget counts, not in the NATS client's
//! subscription buffer, which is bounded only by a count of messages
//! (`nats.subscription_capacity`) of up to the server's max_payload each.
//! Measured before this: 2,000 results of 1 MiB at one worker grew it past
//! 1 GiB against nats-server 2.9.10.
//!
//! A refused result is handed on as [`Admission::OverBudget`], its bytes
//! dropped at once: the pipeline still gives it its one output (a dead
//! letter `over_budget` without the input's bytes).

use super::budget::ByteBudget;
use super::core::Subscriptions;
use super::{Admission, Admitted, Feed};
use bytes::Bytes;
use futures::future::OptionFuture;

/// Takes results from `subscriptions` until they are drained or closed.
pub(super) async fn run(subscriptions: Subscriptions, budget: ByteBudget, feed: Feed) {
    let Feed { admitted, drain } = feed;
    let mut subscriptions = subscriptions;
    let mut drain = Some(drain);
    loop {
        let next = tokio::select! {
            biased;
            request = OptionFuture::from(drain.as_mut()), if drain.is_some() => {
                drain = None;
                if let Some(Ok(done)) = request {
                    subscriptions.drain().await;
                    let _ = done.send(());
                }
                continue;
            }
            next = subscriptions.next() => next,
        };
        let Some(mut delivery) = next else { break };
        let admission = match budget.try_hold(delivery.payload.len()) {
            Some(held) => {
                delivery.payload = own_allocation(delivery.payload);
                Admission::Admitted(Admitted {
                    delivery,
                    held,
                    slot: None,
                })
            }
            None => {
                // The bytes go first: a flood of refusals must not hold them.
                let bytes = std::mem::take(&mut delivery.payload).len();
                Admission::OverBudget { delivery, bytes }
            }
        };
        if admitted.send(admission).is_err() {
            break;
        }
    }
}

/// The payload in an allocation of its own size. The NATS client slices
/// each payload out of its read buffer, whose allocation (grown to hold a
/// 1 MiB message, often with part of the next) stays alive while any slice
/// of it does: held results pinned several times their own bytes. A large
/// payload is copied out (~0.1 ms per MiB) so that what the budget counts is
/// what is held.
pub(crate) fn own_allocation(payload: Bytes) -> Bytes {
    if payload.len() < OWN_ALLOCATION_FROM {
        return payload;
    }
    Bytes::copy_from_slice(&payload)
}

/// Payloads at least this large are copied out of the read buffer; typical
/// results are a few KiB and never pay for the copy.
const OWN_ALLOCATION_FROM: usize = 64 * 1024;
