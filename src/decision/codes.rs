//! The codes the worker puts on the wire. The string form of each variant is
//! part of the public contract.

use std::fmt;

/// Codes of error responses sent to the request's reply subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorCode {
    Malformed,
    NoOutput,
    PrefillFailed,
    NoDisaggregatedParams,
    MissingCtxRequestId,
    InvalidCtxRequestId,
    InvalidRequestType,
    InvalidDisaggRequestId,
    IdentityUnavailable,
    InvalidBootstrap,
    InvalidKvTransferParams,
    /// `deadline_ms` or the `Handoff-Deadline` header is not a deadline.
    InvalidDeadline,
    /// A result that would go to decode came after its deadline.
    DeadlineExceeded,
    /// A result that would go to decode was cancelled on the cancel subject.
    Cancelled,
    /// A TensorRT-LLM handoff without `disagg_request_id`, under the policy
    /// `trtllm.missing_disagg_request_id = "refuse"`: the context phase ran
    /// without the ID its transfer session is keyed by.
    MissingDisaggRequestId,
    /// `kv_expires_ms` or the `Handoff-KV-Expires` header is not a time.
    InvalidKvExpires,
    /// A result that would go to decode came after its prefill engine freed
    /// the KV (or would have, by `kv_hold_ms`).
    KvExpired,
    /// The ID mint service's answer beyond its budget (`id_service.*`);
    /// the decision never gives it.
    RateLimited,
    /// Core mode, beside the `over_budget` dead letter of a result the byte
    /// budget refused: a notice to its client, which may retry; the
    /// decision never gives it.
    OverBudget,
    /// The worker could not write its output for a valid result (JSON
    /// cannot carry a value in it): a bug of the worker, not of the result.
    Internal,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 20] = [
        ErrorCode::Malformed,
        ErrorCode::NoOutput,
        ErrorCode::PrefillFailed,
        ErrorCode::NoDisaggregatedParams,
        ErrorCode::MissingCtxRequestId,
        ErrorCode::InvalidCtxRequestId,
        ErrorCode::InvalidRequestType,
        ErrorCode::InvalidDisaggRequestId,
        ErrorCode::IdentityUnavailable,
        ErrorCode::InvalidBootstrap,
        ErrorCode::InvalidKvTransferParams,
        ErrorCode::InvalidDeadline,
        ErrorCode::DeadlineExceeded,
        ErrorCode::Cancelled,
        ErrorCode::MissingDisaggRequestId,
        ErrorCode::InvalidKvExpires,
        ErrorCode::KvExpired,
        ErrorCode::RateLimited,
        ErrorCode::OverBudget,
        ErrorCode::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::NoOutput => "no_output",
            ErrorCode::PrefillFailed => "prefill_failed",
            ErrorCode::NoDisaggregatedParams => "no_disaggregated_params",
            ErrorCode::MissingCtxRequestId => "missing_ctx_request_id",
            ErrorCode::InvalidCtxRequestId => "invalid_ctx_request_id",
            ErrorCode::InvalidRequestType => "invalid_request_type",
            ErrorCode::InvalidDisaggRequestId => "invalid_disagg_request_id",
            ErrorCode::IdentityUnavailable => "identity_unavailable",
            ErrorCode::InvalidBootstrap => "invalid_bootstrap",
            ErrorCode::InvalidKvTransferParams => "invalid_kv_transfer_params",
            ErrorCode::InvalidDeadline => "invalid_deadline",
            ErrorCode::DeadlineExceeded => "deadline_exceeded",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::MissingDisaggRequestId => "missing_disagg_request_id",
            ErrorCode::InvalidKvExpires => "invalid_kv_expires",
            ErrorCode::KvExpired => "kv_expired",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::OverBudget => "over_budget",
            ErrorCode::Internal => "internal",
        }
    }
}

/// Codes of dead letters: input with no usable, allowed reply subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeadLetterCode {
    Malformed,
    TooLarge,
    MissingReplyTo,
    ReplyToNotAllowed,
    /// The worker held its whole byte budget (`max_in_flight_bytes`) when the
    /// input came; the dead letter carries the input's bytes, sent from the
    /// buffer they arrived in.
    OverBudget,
}

impl DeadLetterCode {
    pub const ALL: [DeadLetterCode; 5] = [
        DeadLetterCode::Malformed,
        DeadLetterCode::TooLarge,
        DeadLetterCode::MissingReplyTo,
        DeadLetterCode::ReplyToNotAllowed,
        DeadLetterCode::OverBudget,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterCode::Malformed => "malformed",
            DeadLetterCode::TooLarge => "too_large",
            DeadLetterCode::MissingReplyTo => "missing_reply_to",
            DeadLetterCode::ReplyToNotAllowed => "reply_to_not_allowed",
            DeadLetterCode::OverBudget => "over_budget",
        }
    }
}

/// The finish reason of a terminal first frame, with a bounded set of labels
/// for metrics. Unknown strings are terminal too; they share the `other` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FinishReason {
    Eos,
    Stop,
    Cancelled,
    Abort,
    ContentFilter,
    Error,
    Other,
}

impl FinishReason {
    pub const ALL: [FinishReason; 7] = [
        FinishReason::Eos,
        FinishReason::Stop,
        FinishReason::Cancelled,
        FinishReason::Abort,
        FinishReason::ContentFilter,
        FinishReason::Error,
        FinishReason::Other,
    ];

    pub fn from_label(s: &str) -> FinishReason {
        match s {
            "eos" => FinishReason::Eos,
            "stop" => FinishReason::Stop,
            "cancelled" => FinishReason::Cancelled,
            "abort" => FinishReason::Abort,
            "content_filter" => FinishReason::ContentFilter,
            "error" => FinishReason::Error,
            _ => FinishReason::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Abort => "abort",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Error => "error",
            FinishReason::Other => "other",
        }
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
display_as_str!(ErrorCode, DeadLetterCode, FinishReason);
