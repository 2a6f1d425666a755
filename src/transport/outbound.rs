//! Publishing outputs. `publish` only enqueues on the connection (it does not
//! wait for the server), so outputs are pipelined; `flush` waits until the
//! server has them all.

use async_nats::client::PublishErrorKind;
use async_nats::{Client, HeaderMap, Subject};
use bytes::Bytes;
use std::time::Duration;

/// Why an output could not be published.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// Bigger than the server's `max_payload`: this output can never be sent.
    #[error("the output is larger than the NATS server accepts: {0}")]
    TooLarge(String),
    #[error("publishing to {subject:?} failed: {reason}")]
    Failed { subject: String, reason: String },
}

#[derive(Clone)]
pub struct Outbound {
    client: Client,
}

impl Outbound {
    pub fn new(client: Client) -> Outbound {
        Outbound { client }
    }

    pub async fn publish(
        &self,
        subject: &str,
        headers: Option<HeaderMap>,
        payload: Bytes,
    ) -> Result<(), OutputError> {
        let to = Subject::from(subject);
        let result = match headers {
            Some(headers) => self.client.publish_with_headers(to, headers, payload).await,
            None => self.client.publish(to, payload).await,
        };
        result.map_err(|e| match e.kind() {
            PublishErrorKind::MaxPayloadExceeded => OutputError::TooLarge(e.to_string()),
            _ => OutputError::Failed {
                subject: subject.to_string(),
                reason: e.to_string(),
            },
        })
    }

    /// Waits until the server has received everything published so far, or
    /// `timeout` passes. True when flushed.
    pub async fn flush(&self, timeout: Duration) -> bool {
        match tokio::time::timeout(timeout, self.client.flush()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "flushing NATS failed");
                false
            }
            Err(_) => {
                tracing::warn!(?timeout, "flushing NATS timed out");
                false
            }
        }
    }
}
