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
    /// The stream answered that it cannot store the message (JetStream
    /// error 10077: at its `max_msgs` or `max_bytes` with discard policy
    /// `new`, or its store failing). Every message into it is refused
    /// alike until it has room: worth retrying then, not sooner.
    #[error("the stream on {subject} did not store the message: {reason}")]
    Refused { subject: String, reason: String },
    /// Held (the stream refusing it) until the time the output was good
    /// for ran out: it must not go out any more.
    #[error("held for {subject} until its time ran out")]
    Expired { subject: String },
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
