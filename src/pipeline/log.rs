//! The one outcome log: what was published for a result, at a level by
//! kind (decode jobs and terminal responses at debug, error responses at
//! info, dead letters at warn).

use crate::decision::{Decision, Outcome};

pub(super) fn outcome(outcome: &Outcome, decision: &Decision, source: &str, attempt: i64) {
    let request_id = decision.request_id.as_deref();
    let detail = decision.detail.as_deref();
    match outcome {
        Outcome::Decode { backend, minted } => tracing::debug!(
            ?request_id,
            backend = backend.as_str(),
            minted,
            attempt,
            trailing_frames = decision.trailing_frames,
            "decode job published"
        ),
        Outcome::Terminal { .. } => tracing::debug!(
            ?request_id,
            attempt,
            trailing_frames = decision.trailing_frames,
            "terminal response published"
        ),
        Outcome::Error { code } => tracing::info!(
            code = code.as_str(),
            ?request_id,
            %source,
            attempt,
            detail = ?detail,
            "error response published"
        ),
        Outcome::DeadLetter { code } => tracing::warn!(
            code = code.as_str(),
            %source,
            attempt,
            detail = ?detail,
            "dead letter published"
        ),
    }
}
