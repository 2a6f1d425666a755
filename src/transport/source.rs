//! Where deliveries come from: the in-flight limits a source admits within,
//! and the one [`Source`] both transports feed.

use super::Delivery;
use super::budget::{ByteBudget, Held};
use super::core::intake::Intake;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

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
    /// queue, a batch and a task into the pipeline's future, and a
    /// 240-byte `Delivery` copied at each step cost about 750 instructions
    /// of `memcpy` per result in core-mode bursts (callgrind,
    /// `scripts/instructions.sh`); the box costs one allocation, about 60.
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

/// Where deliveries come from, whichever the mode: core NATS results are
/// read in place from the subscriptions ([`super::core::subscribe`]);
/// JetStream's pull loop, a task of its own ([`super::jetstream::start`]),
/// hands its deliveries on through a channel.
pub struct Source {
    kind: Kind,
}

enum Kind {
    /// Read by the runner itself: no task or channel in between.
    Core(Box<Intake>),
    /// Fed by a transport task.
    Fed {
        admitted: mpsc::UnboundedReceiver<Admission>,
        drain: Option<oneshot::Sender<oneshot::Sender<()>>>,
    },
}

/// The transport task's side of a fed [`Source`].
pub struct Feed {
    /// Unbounded in count; bounded by the limits each admission holds.
    pub admitted: mpsc::UnboundedSender<Admission>,
    /// A drain request, answered once the task takes no new input.
    pub drain: oneshot::Receiver<oneshot::Sender<()>>,
}

impl Source {
    /// A source fed by a transport task through the returned [`Feed`].
    pub fn new() -> (Source, Feed) {
        let (tx, admitted) = mpsc::unbounded_channel();
        let (drain, drain_rx) = oneshot::channel();
        let source = Source {
            kind: Kind::Fed {
                admitted,
                drain: Some(drain),
            },
        };
        let feed = Feed {
            admitted: tx,
            drain: drain_rx,
        };
        (source, feed)
    }

    /// A source read in place from core NATS subscriptions.
    pub(super) fn core(intake: Intake) -> Source {
        Source {
            kind: Kind::Core(Box::new(intake)),
        }
    }

    /// The next admission; `None` once the source is drained or closed and
    /// everything it took is handed on. Cancel-safe.
    pub async fn next(&mut self) -> Option<Admission> {
        match &mut self.kind {
            Kind::Core(intake) => intake.next().await,
            Kind::Fed { admitted, .. } => admitted.recv().await,
        }
    }

    /// An admission already taken, if any; never waits.
    pub fn ready(&mut self) -> Option<Admission> {
        match &mut self.kind {
            Kind::Core(intake) => intake.ready(),
            Kind::Fed { admitted, .. } => admitted.try_recv().ok(),
        }
    }

    /// Stops taking new input; returns once the transport did. What was
    /// already accepted still comes out of [`Source::next`], which then
    /// returns `None`.
    pub async fn drain(&mut self) {
        match &mut self.kind {
            Kind::Core(intake) => intake.drain().await,
            Kind::Fed { drain, .. } => {
                let Some(drain) = drain.take() else {
                    return;
                };
                let (done, accepted) = oneshot::channel();
                if drain.send(done).is_ok() {
                    let _ = accepted.await;
                }
            }
        }
    }
}
