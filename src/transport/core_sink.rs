//! Publishing outputs in core mode. An output is only enqueued on the
//! connection (nothing waits for the server), so outputs are pipelined;
//! [`super::Sink::flush`] waits until the server has them all.
//!
//! Within [`gather`] (the runner's batches) an output is checked as the
//! client checks it ([`CoreSink::keep`]) and kept, and the batch's outputs
//! go to the client's connection task in one command at the batch's end
//! ([`CoreSink::send_kept`]): one command per output cost a channel send
//! and receive each (callgrind, with the output path made synchronous in a
//! batch: 11,409 -> 10,920 instructions per result). In the default layout
//! no output leaves later than before: the batch does not yield on the
//! runtime thread the connection task shares, so that task wrote nothing
//! of a batch before its end anyway. With more runtime threads, or while
//! a large result is decided beside the runtime (`block_in_place`), it
//! could have written a batch's first outputs sooner.

use super::PublishError;
use async_nats::client::PublishErrorKind;
use async_nats::message::OutboundMessage;
use async_nats::{Client, HeaderMap, Subject};
use bytes::Bytes;
use std::cell::RefCell;
use std::future::Future;

tokio::task_local! {
    /// The outputs of the batch running on this task, in order.
    static OUTBOX: RefCell<Vec<OutboundMessage>>;
}

#[derive(Clone)]
pub struct CoreSink {
    client: Client,
    /// The GEN subject, where every decode job goes, built once: a clone
    /// shares its bytes, where building a subject from a `&str` allocated
    /// and copied it for each job.
    gen_jobs: Subject,
}

impl CoreSink {
    pub fn new(client: Client, gen_subject: &str) -> CoreSink {
        CoreSink {
            client,
            gen_jobs: Subject::from(gen_subject),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Checks the output as the client would, and keeps it for the batch
    /// running here; the message back when no batch runs. Not async: in a
    /// batch nothing waits, and a future per output moved its arguments
    /// from layer to layer.
    pub(super) fn keep(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<Option<OutboundMessage>, PublishError> {
        let to = if subject == self.gen_jobs.as_str() {
            self.gen_jobs.clone()
        } else {
            Subject::from(subject)
        };
        let headers = (!headers.is_empty()).then_some(headers);
        let message = self
            .client
            .prepare_publish(to, headers, payload)
            .map_err(|e| publish_error(subject, &e))?;
        let mut message = Some(message);
        let _ = OUTBOX.try_with(|outbox| outbox.borrow_mut().extend(message.take()));
        Ok(message)
    }

    /// Sends one output [`CoreSink::keep`] did not keep.
    pub(super) async fn send_now(
        &self,
        subject: &str,
        message: OutboundMessage,
    ) -> Result<(), PublishError> {
        self.client
            .publish_batch(vec![message])
            .await
            .map_err(|e| publish_error(subject, &e))
    }

    /// Sends what [`gather`] kept, in one command. `Err` with how many
    /// outputs were lost when it could not be sent (the client's connection
    /// task has ended: the worker is stopping, `cli/supervise.rs`).
    pub async fn send_kept(&self, kept: Vec<OutboundMessage>) -> Result<(), usize> {
        let count = kept.len();
        self.client.publish_batch(kept).await.map_err(|_| count)
    }
}

/// `work`, with what it publishes through a [`CoreSink`] kept (in order)
/// instead of sent: take it with [`kept`] once `work` is done, and send it
/// with [`CoreSink::send_kept`]. A plain function, and the caller pins the
/// future where it is: as an `async fn` taking `work`, each layer held a
/// copy of `work`'s space (a batch's future, several KiB), and spawning
/// the batch copied it all (callgrind: 11,409 -> 15,876 instructions per
/// result).
///
/// `outputs`: room for how many (a batch's results: growing the list one
/// output at a time cost about 50 instructions per output).
pub fn gather<F: Future>(work: F, outputs: usize) -> Gathering<F> {
    OUTBOX.scope(RefCell::new(Vec::with_capacity(outputs)), work)
}

/// [`gather`]'s future.
pub type Gathering<F> = tokio::task::futures::TaskLocalFuture<RefCell<Vec<OutboundMessage>>, F>;

/// What the finished `work` of [`gather`] published.
pub fn kept<F: Future>(gathering: std::pin::Pin<&mut Gathering<F>>) -> Vec<OutboundMessage> {
    gathering
        .take_value()
        .map(RefCell::into_inner)
        .unwrap_or_default()
}

/// What a client publish error means for the output.
pub(super) fn publish_error(subject: &str, e: &async_nats::PublishError) -> PublishError {
    match e.kind() {
        PublishErrorKind::MaxPayloadExceeded => PublishError::TooLarge(e.to_string()),
        PublishErrorKind::InvalidSubject => PublishError::InvalidSubject {
            subject: subject.to_string(),
            reason: e.to_string(),
        },
        PublishErrorKind::Send => PublishError::Failed {
            subject: subject.to_string(),
            reason: e.to_string(),
        },
    }
}
