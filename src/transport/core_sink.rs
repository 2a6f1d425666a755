//! Publishing outputs in core mode. `publish` only enqueues on the
//! connection (it does not wait for the server), so outputs are pipelined;
//! [`super::Sink::flush`] waits until the server has them all.

use super::PublishError;
use async_nats::client::PublishErrorKind;
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

    pub async fn publish(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        let to = if subject == self.gen_jobs.as_str() {
            self.gen_jobs.clone()
        } else {
            Subject::from(subject)
        };
        let result = if headers.is_empty() {
            self.client.publish(to, payload).await
        } else {
            self.client.publish_with_headers(to, headers, payload).await
        };
        result.map_err(|e| publish_error(subject, &e))
    }
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
