//! What a source hands on: a delivery admitted within the in-flight limits
//! (processing slots and the byte budget), or one the budget had no room
//! for. A leaf below both transports and the [`super::Source`] they feed.

use super::Delivery;
use super::budget::{ByteBudget, Held};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The in-flight bounds every source admits deliveries within, shared with
/// the runner that frees them: processing slots (`max_in_flight`) and bytes
/// (`max_in_flight_bytes`).
#[derive(Clone, Debug)]
pub struct Limits {
    pub slots: Arc<Semaphore>,
    /// The slots in all (`max_in_flight`).
    pub max_in_flight: usize,
    pub budget: ByteBudget,
}

impl Limits {
    pub fn new(max_in_flight: usize, max_in_flight_bytes: usize) -> Limits {
        // At least one, or nothing would ever be taken; the runner's options
        // cap it at u32::MAX, far below the semaphore's limit.
        let slots = max_in_flight.max(1);
        Limits {
            slots: Arc::new(Semaphore::new(slots)),
            max_in_flight: slots,
            budget: ByteBudget::new(max_in_flight_bytes),
        }
    }
}

/// A delivery taken, holding its bytes (and, once given, its processing
/// slot) until dropped.
#[derive(Debug)]
pub struct Admitted {
    /// Boxed: an admission moves from the subscription through the runner's
    /// queue, a batch and a task into the pipeline's future, and copying
    /// the whole `Delivery` at each step costs far more than the box's one
    /// allocation (docs/performance.md, "Figures behind choices in the
    /// code").
    pub delivery: Box<Delivery>,
    pub held: Held,
    /// The processing slot, when the source took one before it pulled; the
    /// runner takes one otherwise.
    pub slot: Option<OwnedSemaphorePermit>,
}

/// What a source hands on.
#[derive(Debug)]
pub enum Admission {
    Admitted(Admitted),
    /// The byte budget had no room: the delivery (with its payload, `bytes`
    /// long, outside the budget) must be answered without being decided,
    /// and its bytes let go of before the next read.
    OverBudget {
        delivery: Box<Delivery>,
        bytes: usize,
    },
}
