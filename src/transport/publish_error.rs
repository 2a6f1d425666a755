//! Why an output did not go out, for both delivery modes' sinks: a leaf
//! below them and the [`super::Sink`] that names them.

use async_nats::client::PublishErrorKind;

/// Why an output is not known to have reached the server.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Bigger than the server's `max_payload`: this output can never be sent.
    #[error("the output is larger than the NATS server accepts: {0}")]
    TooLarge(String),
    /// A subject the client refuses: this output can never be sent there.
    #[error("{subject:?} is not a subject NATS accepts: {reason}")]
    InvalidSubject { subject: String, reason: String },
    /// Worth retrying later: the server, the connection or the stream failed.
    #[error("publishing to {subject}: {reason}")]
    Failed { subject: String, reason: String },
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
