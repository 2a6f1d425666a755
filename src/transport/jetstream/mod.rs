//! JetStream delivery mode (contract 7): a work-queue stream over the prefill
//! subjects, one durable pull consumer shared by all workers, and an ack only
//! after the message's output is published (and stored, when GEN is a stream).
//!
//! - [`setup`]: the streams and the consumer, created or checked idempotently.

pub mod setup;

use crate::config::ConfigError;

/// What can go wrong talking to JetStream.
#[derive(Debug, thiserror::Error)]
pub enum JetStreamError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A JetStream API request failed (server unreachable, permission, ...).
    #[error("JetStream: {0}")]
    Api(String),
    /// A stream or consumer exists with settings that cannot be changed in place.
    #[error("{0}")]
    Incompatible(String),
}
