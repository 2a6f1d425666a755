//! The one outcome log: what was published for a result, at a level by
//! kind (decode jobs and terminal responses at debug, error responses at
//! info, dead letters at warn).
//!
//! Error responses and dead letters come at whatever rate publishers send
//! bad input, so their info and warn lines are limited: at most
//! [`LINES_PER_SEC`] of each kind per second. The rest go out at debug, and
//! the next line at the higher level says how many did (`not_logged`). The
//! metrics count every one. A line for each would cost the worker CPU in
//! proportion to the bad input (`docs/performance.md`), and a flood of bad
//! input would become a flood of log lines.

use crate::decision::{Decision, Outcome};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Lines of each limited kind per second at their own level.
pub(super) const LINES_PER_SEC: u32 = 20;

static ERROR_LINES: LineLimit = LineLimit::new(LINES_PER_SEC);
static DEAD_LETTER_LINES: LineLimit = LineLimit::new(LINES_PER_SEC);

/// One line at `$level` with `not_logged` when `$limit` admits it, else the
/// same line at debug: both levels carry the same fields (each field,
/// the last one too, followed by a comma).
macro_rules! limited {
    ($limit:expr, $level:ident, $message:literal, $($field:tt)*) => {
        match $limit.admit(Instant::now()) {
            Some(not_logged) => tracing::$level!($($field)* not_logged, $message),
            None => tracing::debug!($($field)* $message),
        }
    };
}

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
        Outcome::Error { code } => limited!(
            ERROR_LINES,
            info,
            "error response published",
            code = code.as_str(),
            ?request_id,
            %source,
            attempt,
            detail = ?detail,
        ),
        Outcome::DeadLetter { code } => limited!(
            DEAD_LETTER_LINES,
            warn,
            "dead letter published",
            code = code.as_str(),
            %source,
            attempt,
            detail = ?detail,
        ),
    }
}

/// At most `per_sec` lines in each one-second window.
pub(super) struct LineLimit {
    per_sec: u32,
    /// (the window's start, lines written in it, lines not written since
    /// the last one that was)
    state: Mutex<(Option<Instant>, u32, u64)>,
}

impl LineLimit {
    pub(super) const fn new(per_sec: u32) -> LineLimit {
        LineLimit {
            per_sec,
            state: Mutex::new((None, 0, 0)),
        }
    }

    /// Whether a line may be written at `now`: `Some` with how many were
    /// not written before it, or `None` (this one is not, and is counted).
    pub(super) fn admit(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (start, written, not_written) = &mut *state;
        if start.is_none_or(|s| now.saturating_duration_since(s) >= Duration::from_secs(1)) {
            *start = Some(now);
            *written = 0;
        }
        if *written >= self.per_sec {
            *not_written += 1;
            return None;
        }
        *written += 1;
        Some(std::mem::take(not_written))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_limited_per_second_and_the_next_one_counts_the_rest() {
        let limit = LineLimit::new(3);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // (time of the line, what `admit` answers)
        let cases = [
            (0, Some(0)),
            (1, Some(0)),
            (2, Some(0)),
            (3, None),
            (999, None),
            (1_000, Some(2)),
            (1_001, Some(0)),
            (1_002, Some(0)),
            (1_003, None),
            (5_000, Some(1)),
        ];
        for (ms, expected) in cases {
            assert_eq!(limit.admit(at(ms)), expected, "line at {ms} ms");
        }
    }
}
