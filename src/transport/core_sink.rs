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
}

impl CoreSink {
    pub fn new(client: Client) -> CoreSink {
        CoreSink { client }
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
        let to = Subject::from(subject);
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
