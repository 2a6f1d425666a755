//! Publishing outputs in core mode. An output is only enqueued on the
//! connection (nothing waits for the server), so outputs are pipelined;
//! [`crate::transport::Sink::flush`] waits until the server has them all.
//! A batch's outputs go into its [`Outbox`] and leave together
//! ([`CoreSink::send`]); one outside a batch leaves at once.

use super::Outbox;
use crate::transport::publish_error::{PublishError, publish_error};
use async_nats::client::traits::Publisher as _;
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
    /// Whether `gen_jobs` passes the check: then a decode job's subject,
    /// which is that one, is not checked again per job.
    gen_jobs_valid: bool,
}

impl CoreSink {
    pub fn new(client: Client, gen_subject: &str) -> CoreSink {
        CoreSink {
            client,
            gen_jobs: Subject::from(gen_subject),
            gen_jobs_valid: valid_subject(gen_subject),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The output, checked as the client checks it when it is sent (the
    /// subject as `is_valid_publish_subject`, the size against the server's
    /// `max_payload`): refused here, it gets its stand-in (a dead letter)
    /// at once, not when its batch is sent.
    fn check(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<OutboundMessage, PublishError> {
        let gen_jobs = subject == self.gen_jobs.as_str();
        let checked_once = gen_jobs && self.gen_jobs_valid;
        if !checked_once && !valid_subject(subject) {
            return Err(PublishError::InvalidSubject {
                subject: subject.to_string(),
                reason: "a subject must be non-empty and hold no space, tab or line break"
                    .to_string(),
            });
        }
        let size = wire_len(&headers) + payload.len();
        let max_payload = self.client.max_payload();
        if size > max_payload {
            return Err(PublishError::TooLarge(format!(
                "{size} bytes of headers and payload; the server accepts {max_payload}"
            )));
        }
        let subject = if gen_jobs {
            self.gen_jobs.clone()
        } else {
            Subject::from(subject)
        };
        Ok(OutboundMessage {
            subject,
            reply: None,
            headers: (!headers.is_empty()).then_some(headers),
            payload,
        })
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
            .publish_message(message)
            .await
            .map_err(|e| publish_error(subject, &e))
    }

    /// Sends what `outbox` holds, in order, one publish each. Returns how
    /// many went out: the first that many; the rest were lost with the
    /// client (its connection task has ended: the worker is stopping,
    /// `cli/supervise.rs`).
    pub async fn send(&self, outbox: Outbox) -> usize {
        let mut out = 0;
        for message in outbox.messages {
            if self.client.publish_message(message).await.is_err() {
                break;
            }
            out += 1;
        }
        out
    }
}

/// Whether the client sends to `subject` (as `is_valid_publish_subject`):
/// not empty, and no space, tab or line break. Byte by byte: a `contains`
/// of a set of chars decodes each char first.
fn valid_subject(subject: &str) -> bool {
    !subject.is_empty()
        && !subject
            .bytes()
            .any(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

/// The bytes `headers` take on the wire (as the client writes them:
/// `NATS/1.0`, a `Name: value` line each, a blank line); 0 for none.
fn wire_len(headers: &HeaderMap) -> usize {
    if headers.is_empty() {
        return 0;
    }
    let lines: usize = headers
        .iter()
        .map(|(name, values)| {
            let name: &str = name.as_ref();
            values
                .iter()
                .map(|v| name.len() + v.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum();
    b"NATS/1.0\r\n".len() + lines + 2
}
