//! Publishing outputs in core mode. An output is only enqueued on the
//! connection (nothing waits for the server), so outputs are pipelined;
//! [`crate::transport::Sink::flush`] waits until the server has them all.
//! A batch's outputs go into its [`Outbox`] and leave together
//! ([`CoreSink::send`]); one outside a batch leaves at once.

use super::Outbox;
use crate::transport::PublishError;
use crate::transport::sink::publish_error;
use async_nats::message::OutboundMessage;
use async_nats::{Client, HeaderMap, Subject};
use bytes::Bytes;

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

    /// The output, checked as the client will check it when it is sent:
    /// refused here, it can get its stand-in (a dead letter) at once.
    fn check(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<OutboundMessage, PublishError> {
        let to = if subject == self.gen_jobs.as_str() {
            self.gen_jobs.clone()
        } else {
            Subject::from(subject)
        };
        let headers = (!headers.is_empty()).then_some(headers);
        self.client
            .prepare_publish(to, headers, payload)
            .map_err(|e| publish_error(subject, &e))
    }

    /// Checks the output and puts it in `outbox`; it leaves when the outbox
    /// is sent. Not async: nothing waits.
    pub fn put(
        &self,
        outbox: &mut Outbox,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        let message = self.check(subject, headers, payload)?;
        outbox.messages.push(message);
        Ok(())
    }

    /// Checks the output and sends it at once.
    pub async fn send_one(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        let message = self.check(subject, headers, payload)?;
        self.client
            .publish_batch(vec![message])
            .await
            .map_err(|e| publish_error(subject, &e))
    }

    /// Sends what `outbox` holds, in order. Returns how many went out: the
    /// first that many; the rest were lost with the client (its connection
    /// task has ended: the worker is stopping, `cli/supervise.rs`).
    pub async fn send(&self, outbox: Outbox) -> usize {
        let count = outbox.len();
        match self.client.publish_batch(outbox.messages).await {
            Ok(()) => count,
            Err(_) => 0,
        }
    }
}
