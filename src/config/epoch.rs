//! `id_epoch`: an RFC 3339 instant in UTC, turned into Unix milliseconds.
//!
//! The `time` crate parses RFC 3339 (`T`/`Z` in either case, any number of
//! fraction digits, calendar checks); on top of it, three rules of ours:
//! the offset must be UTC (`Z`, `+00:00` or `-00:00`: every worker of a fleet
//! must count from the same written instant), no leap second (`:60`, which
//! `time` folds into the second before it), and not before 1970 (an ID
//! timestamp counts whole Unix milliseconds). A space in place of `T`
//! (RFC 3339, section 5.6, note) is accepted too. The fraction keeps
//! milliseconds; further digits are dropped.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Why a text is not an `id_epoch`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EpochError {
    /// Not RFC 3339 at all, or a date or time that does not exist.
    #[error("{0}")]
    Syntax(String),
    #[error(
        "the offset must be UTC ('Z' or '+00:00'); every worker of a fleet must count from the same instant"
    )]
    NotUtc,
    #[error("leap seconds (:60) are not accepted")]
    LeapSecond,
    #[error("the year must be 1970 or later")]
    Before1970,
}

/// Parses `text` as an RFC 3339 UTC instant: Unix milliseconds.
pub fn parse_utc_ms(text: &str) -> Result<u64, EpochError> {
    // RFC 3339 lets applications use a space for `T`; `time` does not.
    let normalized;
    let text = match text.as_bytes().get(10) {
        Some(b' ') if text.is_char_boundary(10) && text.is_char_boundary(11) => {
            normalized = format!("{}T{}", &text[..10], &text[11..]);
            normalized.as_str()
        }
        _ => text,
    };
    let instant = OffsetDateTime::parse(text, &Rfc3339).map_err(|e| syntax(text, e))?;
    if !instant.offset().is_utc() {
        return Err(EpochError::NotUtc);
    }
    // `time` reads `23:59:60` as the last nanosecond of `23:59:59`; only the
    // text still shows it.
    if text.get(17..19) == Some("60") {
        return Err(EpochError::LeapSecond);
    }
    let ms = instant.unix_timestamp_nanos() / 1_000_000;
    u64::try_from(ms).map_err(|_| EpochError::Before1970)
}

/// `time`'s reason, naming the offending field's value where `time` only
/// names the field ("month 13 does not exist", not "month was not in range").
fn syntax(text: &str, e: time::error::Parse) -> EpochError {
    use time::error::{Parse, TryFromParsed};
    // RFC 3339 fixes the positions: YYYY-MM-DDTHH:MM:SS.
    let field = |at: std::ops::Range<usize>| text.get(at).unwrap_or("?");
    let why = match &e {
        Parse::TryFromParsed(TryFromParsed::ComponentRange(range)) => match range.name() {
            "month" => format!("month {} does not exist", field(5..7)),
            "day" => format!("{} has no day {}", field(0..7), field(8..10)),
            "hour" | "minute" | "second" => {
                format!("{} is not a time of day", field(11..19))
            }
            _ => e.to_string(),
        },
        _ => e.to_string(),
    };
    EpochError::Syntax(why)
}
