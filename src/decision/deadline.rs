//! Deadlines and cancellation at the handoff (contract 10): when a result
//! that would become a decode job is refused instead, because its client is
//! gone.
//!
//! A deadline is Unix epoch milliseconds, from the result's top-level field
//! `deadline_ms` and the header `Handoff-Deadline`; with both, the earlier
//! counts. A present `null` field counts as absent, as for every optional
//! field. The rules here are the one statement of them for both decision
//! paths (the value-tree path and the in-place one): each reads the field its
//! own way and hands it to [`effective`].
//!
//! Time is an argument ([`super::Input::now_ms`]): nothing here reads a clock.

use super::ErrorCode;
use super::handoff::describe;
use super::header_values::truncate;
use crate::headers::names::HANDOFF_DEADLINE;
use rmpv::Value;

/// The largest deadline accepted: 2^63 - 1 (a deadline is in [0, 2^63)).
pub const MAX_DEADLINE_MS: u64 = (1 << 63) - 1;

/// The longest cancel reason quoted in an error response, in bytes.
pub const MAX_REASON_BYTES: usize = 256;

/// The deadline field of a result, as the value-tree path reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Field<'a> {
    /// Absent or `null`.
    None,
    /// A valid deadline.
    Ms(u64),
    /// Anything else: a value tree to describe.
    Invalid(&'a Value),
}

impl<'a> Field<'a> {
    /// The field as the value-tree path holds it.
    pub fn of(value: Option<&'a Value>) -> Field<'a> {
        match value {
            None | Some(Value::Nil) => Field::None,
            Some(v) => match v.as_u64().filter(|ms| *ms <= MAX_DEADLINE_MS) {
                Some(ms) => Field::Ms(ms),
                None => Field::Invalid(v),
            },
        }
    }
}

/// The `Handoff-Deadline` header's value: decimal digits (surrounding spaces
/// and tabs allowed) for a number in [0, 2^63); `None` for anything else.
pub fn parse_header(value: &str) -> Option<u64> {
    let digits = value.trim_matches([' ', '\t']);
    // At most 19 digits: 2^63 - 1 has 19, and a longer run cannot overflow
    // the parse below before being refused.
    if digits.is_empty() || digits.len() > 19 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<u64>()
        .ok()
        .filter(|ms| *ms <= MAX_DEADLINE_MS)
}

/// The deadline a result has, from its field and its header (the first
/// `Handoff-Deadline` value): the earlier of the two, or an
/// `invalid_deadline` error message naming the one that is not a deadline.
pub fn effective(field: Field<'_>, header: Option<&str>) -> Result<Option<u64>, String> {
    let from_field = match field {
        Field::None => None,
        Field::Ms(ms) => Some(ms),
        Field::Invalid(v) => {
            return Err(format!(
                "deadline_ms is {}; expected null or an integer in [0, 2^63): Unix epoch milliseconds",
                describe(v)
            ));
        }
    };
    let from_header = match header {
        None => None,
        Some(raw) => match parse_header(raw) {
            Some(ms) => Some(ms),
            None => {
                return Err(format!(
                    "the {HANDOFF_DEADLINE} header is {:?}; expected a decimal integer in [0, 2^63): Unix epoch milliseconds",
                    truncate(raw, 64)
                ));
            }
        },
    };
    Ok(match (from_field, from_header) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// A cancel on record for a request ([`Cancels::lookup`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cancelled {
    /// The canceller's `reason`, if it gave one.
    pub reason: Option<String>,
}

/// The requests cancelled so far, as the decision asks about them.
/// Implemented by the worker's cancel set (`crate::cancel`).
pub trait Cancels: Send + Sync {
    /// The cancel recorded for `request_id` and still held at `now_ms`
    /// (Unix ms), if any.
    fn lookup(&self, request_id: &str, now_ms: u64) -> Option<Cancelled>;
}

/// No request is ever cancelled: a decision made without a cancel set.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCancels;

impl Cancels for NoCancels {
    fn lookup(&self, _: &str, _: u64) -> Option<Cancelled> {
        None
    }
}

/// [`NoCancels`] as the decision's input takes it.
pub const NO_CANCELS: &dyn Cancels = &NoCancels;

/// Why a result that would go to decode is refused: it was cancelled, or its
/// deadline has passed (`now_ms` at or past `deadline + skew_ms`). A cancel
/// wins over a passed deadline: it is the client's own word. `None`: it goes
/// to decode. Asked before an ID is minted for the job, so that a refused
/// result spends none.
pub fn refusal(
    request_id: &str,
    deadline: Option<u64>,
    now_ms: u64,
    skew_ms: u64,
    cancels: &dyn Cancels,
) -> Option<(ErrorCode, String)> {
    if let Some(cancel) = cancels.lookup(request_id, now_ms) {
        return Some((ErrorCode::Cancelled, cancelled_message(&cancel)));
    }
    let deadline = deadline?;
    passed(deadline, now_ms, skew_ms).then(|| {
        (
            ErrorCode::DeadlineExceeded,
            exceeded_message(deadline, now_ms),
        )
    })
}

/// Whether a deadline has passed at `now_ms`, allowing `skew_ms` for the
/// clocks of whoever set it and this worker.
pub fn passed(deadline: u64, now_ms: u64, skew_ms: u64) -> bool {
    now_ms >= deadline.saturating_add(skew_ms)
}

fn exceeded_message(deadline: u64, now_ms: u64) -> String {
    format!(
        "the request's deadline ({deadline} ms since the Unix epoch) passed {} ms before the handoff; no decode job was sent",
        now_ms - deadline.min(now_ms)
    )
}

fn cancelled_message(cancel: &Cancelled) -> String {
    match cancel.reason.as_deref().filter(|r| !r.is_empty()) {
        Some(reason) => format!(
            "the request was cancelled ({}); no decode job was sent",
            truncate(reason, MAX_REASON_BYTES)
        ),
        None => "the request was cancelled; no decode job was sent".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = MAX_DEADLINE_MS;

    #[test]
    fn the_field_is_a_deadline_when_it_is_an_integer_in_range() {
        let cases: [(Option<Value>, Option<Option<u64>>); 10] = [
            (None, Some(None)),
            (Some(Value::Nil), Some(None)),
            (Some(Value::from(0)), Some(Some(0))),
            (
                Some(Value::from(1_767_225_600_000u64)),
                Some(Some(1_767_225_600_000)),
            ),
            (Some(Value::from(MAX)), Some(Some(MAX))),
            (Some(Value::from(MAX + 1)), None),
            (Some(Value::from(-1)), None),
            (Some(Value::F64(1000.0)), None),
            (Some(Value::from("1000")), None),
            (Some(Value::Boolean(true)), None),
        ];
        for (value, want) in cases {
            let got = effective(Field::of(value.as_ref()), None);
            match want {
                Some(ms) => assert_eq!(got, Ok(ms), "{value:?}"),
                None => {
                    let why = got.expect_err("invalid");
                    assert!(why.starts_with("deadline_ms is "), "{why}");
                }
            }
        }
    }

    #[test]
    fn the_header_is_a_deadline_when_it_is_decimal_in_range() {
        let cases: [(&str, Option<u64>); 14] = [
            ("0", Some(0)),
            ("1767225600000", Some(1_767_225_600_000)),
            (" 42\t", Some(42)),
            ("007", Some(7)),
            ("9223372036854775807", Some(MAX)),
            ("9223372036854775808", None),
            ("18446744073709551616", None),
            ("00000000000000000001", None),
            ("", None),
            ("-1", None),
            ("+1", None),
            ("1.5", None),
            ("1e3", None),
            ("12 34", None),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_header(raw), want, "{raw:?}");
            let got = effective(Field::None, Some(raw));
            match want {
                Some(ms) => assert_eq!(got, Ok(Some(ms)), "{raw:?}"),
                None => assert!(
                    got.expect_err("invalid")
                        .contains("Handoff-Deadline header"),
                    "{raw:?}"
                ),
            }
        }
    }

    #[test]
    fn with_both_the_earlier_counts_and_either_invalid_is_refused() {
        let body = Value::from(2000);
        let field = Field::of(Some(&body));
        assert_eq!(effective(field, Some("1000")), Ok(Some(1000)));
        assert_eq!(effective(field, Some("3000")), Ok(Some(2000)));
        assert_eq!(effective(field, Some("2000")), Ok(Some(2000)));
        assert!(effective(field, Some("soon")).is_err());
        let float = Value::F64(1.0);
        assert!(effective(Field::of(Some(&float)), Some("1000")).is_err());
        assert_eq!(effective(Field::None, None), Ok(None));
    }

    struct One(&'static str, Option<&'static str>);

    impl Cancels for One {
        fn lookup(&self, request_id: &str, _: u64) -> Option<Cancelled> {
            (request_id == self.0).then(|| Cancelled {
                reason: self.1.map(str::to_string),
            })
        }
    }

    #[test]
    fn a_decode_bound_result_is_refused_when_cancelled_or_past_its_deadline() {
        let none = NO_CANCELS;
        let cancelled = &One("r1", Some("client disconnected"));
        // (request, deadline, now, skew, cancels) -> code
        type Case<'a> = (
            &'a str,
            Option<u64>,
            u64,
            u64,
            &'a dyn Cancels,
            Option<ErrorCode>,
        );
        let cases: [Case; 10] = [
            ("r1", None, 5_000, 0, none, None),
            ("r1", Some(5_001), 5_000, 0, none, None),
            (
                "r1",
                Some(5_000),
                5_000,
                0,
                none,
                Some(ErrorCode::DeadlineExceeded),
            ),
            (
                "r1",
                Some(4_000),
                5_000,
                0,
                none,
                Some(ErrorCode::DeadlineExceeded),
            ),
            (
                "r1",
                Some(4_000),
                5_000,
                1_000,
                none,
                Some(ErrorCode::DeadlineExceeded),
            ),
            ("r1", Some(4_000), 5_000, 1_001, none, None),
            ("r1", Some(MAX), 5_000, u64::MAX, none, None),
            ("r1", None, 5_000, 0, cancelled, Some(ErrorCode::Cancelled)),
            (
                "r1",
                Some(4_000),
                5_000,
                0,
                cancelled,
                Some(ErrorCode::Cancelled),
            ),
            ("r2", Some(9_000), 5_000, 0, cancelled, None),
        ];
        for (id, deadline, now, skew, cancels, want) in cases {
            let got = refusal(id, deadline, now, skew, cancels).map(|(code, _)| code);
            assert_eq!(got, want, "{id} {deadline:?} now {now} skew {skew}");
        }
    }

    #[test]
    fn refusals_say_what_happened() {
        let (_, why) = refusal("r1", Some(4_000), 5_000, 0, NO_CANCELS).unwrap();
        assert_eq!(
            why,
            "the request's deadline (4000 ms since the Unix epoch) passed 1000 ms before the handoff; no decode job was sent"
        );
        let (_, why) = refusal("r1", None, 0, 0, &One("r1", Some("gone"))).unwrap();
        assert_eq!(
            why,
            "the request was cancelled (gone); no decode job was sent"
        );
        let (_, why) = refusal("r1", None, 0, 0, &One("r1", None)).unwrap();
        assert_eq!(why, "the request was cancelled; no decode job was sent");
        let long = Box::leak("x".repeat(1000).into_boxed_str());
        let (_, why) = refusal("r1", None, 0, 0, &One("r1", Some(long))).unwrap();
        assert!(why.len() < 400, "a long reason is cut: {}", why.len());
    }
}
