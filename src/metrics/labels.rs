//! The label values of the metrics: each a bounded enum whose `ALL` lists
//! every value in discriminant order, so every series exists from the start.
//! The services record into [`Metrics`](super::Metrics) with them; the
//! values for the decision's codes are the decision's own enums.

use crate::decision::Outcome;

/// Why a JetStream message was negatively acknowledged (redelivered later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakReason {
    /// A TensorRT-LLM handoff needed an ID while the worker held no slot.
    IdentityUnavailable,
    /// The output could not be published (or stored in the GEN stream).
    PublishFailed,
}

impl NakReason {
    pub const ALL: [NakReason; 2] = [NakReason::IdentityUnavailable, NakReason::PublishFailed];

    pub fn as_str(self) -> &'static str {
        match self {
            NakReason::IdentityUnavailable => "identity_unavailable",
            NakReason::PublishFailed => "publish_failed",
        }
    }
}

/// Where minted IDs went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MintSource {
    /// Into a TensorRT-LLM decode job that had no `disagg_request_id`.
    DecodeJob,
    /// Answered by the ID mint service.
    IdService,
}

impl MintSource {
    pub const ALL: [MintSource; 2] = [MintSource::DecodeJob, MintSource::IdService];

    pub fn as_str(self) -> &'static str {
        match self {
            MintSource::DecodeJob => "decode_job",
            MintSource::IdService => "id_service",
        }
    }
}

/// Why a finished span was not exported (`crate::telemetry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanDrop {
    /// The export queue (`otel.queue_spans`) was full.
    QueueFull,
    /// The collector refused the batch, could not be reached, or did not
    /// answer within `otel.export_timeout_ms`.
    ExportFailed,
}

impl SpanDrop {
    pub const ALL: [SpanDrop; 2] = [SpanDrop::QueueFull, SpanDrop::ExportFailed];

    pub fn as_str(self) -> &'static str {
        match self {
            SpanDrop::QueueFull => "queue_full",
            SpanDrop::ExportFailed => "export_failed",
        }
    }
}

/// The label of [`Outcome::kind`], in the order of `OUTCOME_KINDS`.
pub(super) const OUTCOME_KINDS: [&str; 4] = ["decode", "terminal", "error", "dead_letter"];

pub(super) fn outcome_index(outcome: &Outcome) -> usize {
    match outcome {
        Outcome::Decode { .. } => 0,
        Outcome::Terminal { .. } => 1,
        Outcome::Error { .. } => 2,
        Outcome::DeadLetter { .. } => 3,
    }
}

/// How one request to the ID mint service (`crate::id_service`) ended, for
/// metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdRequestResult {
    /// IDs were sent.
    Ok,
    /// No slot is held (fenced): error `identity_unavailable` was sent.
    IdentityUnavailable,
    /// The body or count was invalid: error `malformed` was sent.
    Malformed,
    /// The request had no reply subject: nothing could be sent.
    NoReply,
    /// The reply subject is not an allowed reply subject: nothing was sent.
    ReplyRefused,
    /// Beyond the service's budget (`id_service.*`): error `rate_limited` was sent.
    RateLimited,
}

impl IdRequestResult {
    pub const ALL: [IdRequestResult; 6] = [
        IdRequestResult::Ok,
        IdRequestResult::IdentityUnavailable,
        IdRequestResult::Malformed,
        IdRequestResult::NoReply,
        IdRequestResult::ReplyRefused,
        IdRequestResult::RateLimited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            IdRequestResult::Ok => "ok",
            IdRequestResult::IdentityUnavailable => "identity_unavailable",
            IdRequestResult::Malformed => "malformed",
            IdRequestResult::NoReply => "no_reply",
            IdRequestResult::ReplyRefused => "reply_refused",
            IdRequestResult::RateLimited => "rate_limited",
        }
    }
}
