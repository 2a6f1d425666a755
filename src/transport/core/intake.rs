//! The core source's intake: each result is taken off the subscriptions by
//! the runner itself (no task or channel in between) and holds its bytes in
//! the worker's byte budget (`max_in_flight_bytes`), or is refused when the
//! budget is spent.
//!
//! Reading is not gated on free in-flight slots: the runner keeps reading
//! while it waits for one, and a result waiting for a slot waits in the
//! runner, in bytes the budget counts. (The NATS client's subscription
//! buffer is bounded in messages only, `nats.subscription_capacity`; the
//! client yields after a budget of bytes per read so that the runner can
//! refuse between reads: `vendor/patches/0004`.)
//!
//! A refused result is handed on as [`Admission::OverBudget`] with its bytes
//! as they arrived (a slice of the client's read buffer, not copied): the
//! pipeline gives it its one output (a dead letter `over_budget` carrying
//! those bytes) and waits until the client has written it before reading on,
//! so refused bytes held at once are one result's.

use super::Subscriptions;
use crate::transport::budget::ByteBudget;
use crate::transport::{Admission, Admitted, Delivery};
use bytes::Bytes;
use futures::FutureExt;

/// The queue subscriptions and the budget their results are admitted in.
pub(in crate::transport) struct Intake {
    subscriptions: Subscriptions,
    budget: ByteBudget,
}

impl Intake {
    pub(super) fn new(subscriptions: Subscriptions, budget: ByteBudget) -> Intake {
        Intake {
            subscriptions,
            budget,
        }
    }

    /// The next result, admitted or refused; `None` once the subscriptions
    /// are drained or closed. Cancel-safe.
    pub(in crate::transport) async fn next(&mut self) -> Option<Admission> {
        let delivery = self.subscriptions.next().await?;
        Some(self.admit(delivery))
    }

    /// A result already received, if any; never waits.
    pub(in crate::transport) fn ready(&mut self) -> Option<Admission> {
        // `Subscriptions::next` is cancel-safe: a pending poll loses nothing.
        let delivery = self.subscriptions.next().now_or_never()??;
        Some(self.admit(delivery))
    }

    /// Unsubscribes; results already received still come out of `next`.
    pub(in crate::transport) async fn drain(&mut self) {
        self.subscriptions.drain().await;
    }

    fn admit(&self, mut delivery: Box<Delivery>) -> Admission {
        match self.budget.try_hold(delivery.payload.len()) {
            Some(held) => {
                delivery.payload = own_allocation(delivery.payload);
                Admission::Admitted(Admitted {
                    delivery,
                    held,
                    slot: None,
                })
            }
            None => {
                let bytes = delivery.payload.len();
                Admission::OverBudget { delivery, bytes }
            }
        }
    }
}

/// The payload in an allocation of its own size. The NATS client slices
/// each payload out of its read buffer, whose allocation (grown to hold a
/// 1 MiB message, often with part of the next) stays alive while any slice
/// of it does: held results pinned several times their own bytes. A large
/// payload is copied out, a cost linear in its bytes (`docs/performance.md`),
/// so that what the budget counts is what is held.
pub(crate) fn own_allocation(payload: Bytes) -> Bytes {
    if payload.len() < OWN_ALLOCATION_FROM {
        return payload;
    }
    Bytes::copy_from_slice(&payload)
}

/// Payloads at least this large are copied out of the read buffer; typical
/// results are a few KiB and never pay for the copy.
const OWN_ALLOCATION_FROM: usize = 64 * 1024;
