//! Where deliveries come from: the one [`Source`] both transports feed.

use super::admission::{Admission, Limits};
use super::core::intake::Intake;
use super::{TransportError, core};
use async_nats::Client;
use tokio::sync::{mpsc, oneshot};

/// Where deliveries come from, whichever the mode: core NATS results are
/// read in place from the subscriptions ([`Source::core`]);
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

    /// Core NATS: subscribes to each subject in `queue_group`, and reads
    /// the results in place within `limits`' byte budget
    /// ([`core::subscribe`]).
    pub async fn core(
        client: &Client,
        subjects: &[String],
        queue_group: &str,
        limits: &Limits,
    ) -> Result<Source, TransportError> {
        let intake: Intake = core::subscribe(client, subjects, queue_group, limits).await?;
        Ok(Source {
            kind: Kind::Core(Box::new(intake)),
        })
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
