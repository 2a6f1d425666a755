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
use super::header_values::truncate;
use crate::headers::names::{HANDOFF_DEADLINE, HANDOFF_KV_EXPIRES};
use crate::wire::describe;
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
    earlier(field, header, DEADLINE)
}

/// When the result's KV is freed by its prefill engine, from its field
/// `kv_expires_ms` and its header `Handoff-KV-Expires` (the first value):
/// the earlier of the two, or an `invalid_kv_expires` error message. Read
/// like a deadline ([`Field`], [`parse_header`]).
pub fn kv_expires(field: Field<'_>, header: Option<&str>) -> Result<Option<u64>, String> {
    earlier(field, header, KV_EXPIRES)
}

/// A time a result carries in a field and a header: their names, and what
/// the time is, for error messages.
struct Named {
    field: &'static str,
    header: &'static str,
}

const DEADLINE: Named = Named {
    field: "deadline_ms",
    header: HANDOFF_DEADLINE,
};

const KV_EXPIRES: Named = Named {
    field: "kv_expires_ms",
    header: HANDOFF_KV_EXPIRES,
};

fn earlier(field: Field<'_>, header: Option<&str>, names: Named) -> Result<Option<u64>, String> {
    let from_field = match field {
        Field::None => None,
        Field::Ms(ms) => Some(ms),
        Field::Invalid(v) => {
            return Err(format!(
                "{} is {}; expected null or an integer in [0, 2^63): Unix epoch milliseconds",
                names.field,
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
                    "the {} header is {:?}; expected a decimal integer in [0, 2^63): Unix epoch milliseconds",
                    names.header,
                    truncate(raw, 64)
                ));
            }
        },
    };
    Ok(earliest(from_field, from_header))
}

/// The earlier of two times, either of which may be unknown.
pub fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
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

/// When a decode-bound result comes: what the refusal rules read.
#[derive(Debug, Clone, Copy)]
pub struct Timing<'a> {
    pub request_id: &'a str,
    /// The effective deadline ([`effective`]).
    pub deadline: Option<u64>,
    /// When the prefill engine frees the KV: the result's own
    /// ([`kv_expires`]) or its engine's hold ([`super::Rules::kv_expiry`]).
    pub kv_expires: Option<u64>,
    pub now_ms: u64,
    /// How far a deadline may lie behind `now_ms` (`deadline.clock_skew_ms`).
    pub skew_ms: u64,
}

/// Why a result that would go to decode is refused: it was cancelled, its
/// deadline has passed (`now_ms` at or past `deadline + skew_ms`), or its KV
/// was freed (`now_ms` at or past `kv_expires`). A cancel wins over a passed
/// deadline: it is the client's own word; a passed deadline wins over
/// freed KV: the client would not take a retried request either. The KV
/// gets no skew: a job sent a moment after its KV was freed would decode
/// from freed blocks. `None`: it goes to decode. Asked before an ID is
/// minted for the job, so that a refused result spends none.
pub fn refusal(timing: Timing<'_>, cancels: &dyn Cancels) -> Option<(ErrorCode, String)> {
    let Timing {
        request_id,
        deadline,
        kv_expires,
        now_ms,
        skew_ms,
    } = timing;
    if let Some(cancel) = cancels.lookup(request_id, now_ms) {
        return Some((ErrorCode::Cancelled, cancelled_message(&cancel)));
    }
    if let Some(deadline) = deadline
        && passed(deadline, now_ms, skew_ms)
    {
        return Some((
            ErrorCode::DeadlineExceeded,
            exceeded_message(deadline, now_ms),
        ));
    }
    let expires = kv_expires?;
    (now_ms >= expires).then(|| (ErrorCode::KvExpired, expired_message(expires, now_ms)))
}

fn expired_message(expires: u64, now_ms: u64) -> String {
    format!(
        "the prefill engine freed the request's KV at {expires} ms since the Unix epoch, {} ms before the handoff; no decode job was sent: retry the whole request",
        now_ms - expires.min(now_ms)
    )
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

    /// [`refusal`] with no KV expiry.
    fn refuse(
        request_id: &str,
        deadline: Option<u64>,
        now_ms: u64,
        skew_ms: u64,
        cancels: &dyn Cancels,
    ) -> Option<(ErrorCode, String)> {
        let timing = Timing {
            request_id,
            deadline,
            kv_expires: None,
            now_ms,
            skew_ms,
        };
        refusal(timing, cancels)
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
            let got = refuse(id, deadline, now, skew, cancels).map(|(code, _)| code);
            assert_eq!(got, want, "{id} {deadline:?} now {now} skew {skew}");
        }
    }

    #[test]
    fn refusals_say_what_happened() {
        let (_, why) = refuse("r1", Some(4_000), 5_000, 0, NO_CANCELS).unwrap();
        assert_eq!(
            why,
            "the request's deadline (4000 ms since the Unix epoch) passed 1000 ms before the handoff; no decode job was sent"
        );
        let (_, why) = refuse("r1", None, 0, 0, &One("r1", Some("gone"))).unwrap();
        assert_eq!(
            why,
            "the request was cancelled (gone); no decode job was sent"
        );
        let (_, why) = refuse("r1", None, 0, 0, &One("r1", None)).unwrap();
        assert_eq!(why, "the request was cancelled; no decode job was sent");
        let long = Box::leak("x".repeat(1000).into_boxed_str());
        let (_, why) = refuse("r1", None, 0, 0, &One("r1", Some(long))).unwrap();
        assert!(why.len() < 400, "a long reason is cut: {}", why.len());
    }
}

#[cfg(test)]
mod kv_tests {
    use super::*;

    #[test]
    fn the_kv_expiry_is_read_like_a_deadline_under_its_own_names() {
        let body = Value::from(2000);
        let field = Field::of(Some(&body));
        assert_eq!(kv_expires(field, Some("1000")), Ok(Some(1000)));
        assert_eq!(kv_expires(field, None), Ok(Some(2000)));
        assert_eq!(kv_expires(Field::None, None), Ok(None));
        let why = kv_expires(Field::of(Some(&Value::from("soon"))), None).unwrap_err();
        assert!(why.starts_with("kv_expires_ms is the string"), "{why}");
        let why = kv_expires(Field::None, Some("-1")).unwrap_err();
        assert!(why.contains("Handoff-KV-Expires header"), "{why}");
    }

    /// (cancelled, deadline, kv_expires) at now = 5 s, no skew -> code.
    #[test]
    fn a_cancel_wins_then_a_passed_deadline_then_freed_kv() {
        struct All;
        impl Cancels for All {
            fn lookup(&self, _: &str, _: u64) -> Option<Cancelled> {
                Some(Cancelled::default())
            }
        }
        type Case = (bool, Option<u64>, Option<u64>, Option<ErrorCode>);
        let cases: [Case; 8] = [
            (false, None, None, None),
            (false, None, Some(5_001), None),
            (false, None, Some(5_000), Some(ErrorCode::KvExpired)),
            (false, Some(9_000), Some(4_000), Some(ErrorCode::KvExpired)),
            (
                false,
                Some(4_000),
                Some(4_000),
                Some(ErrorCode::DeadlineExceeded),
            ),
            (false, Some(9_000), Some(9_000), None),
            (true, Some(4_000), Some(4_000), Some(ErrorCode::Cancelled)),
            (true, None, None, Some(ErrorCode::Cancelled)),
        ];
        for (cancelled, deadline, kv_expires, want) in cases {
            let cancels: &dyn Cancels = if cancelled { &All } else { NO_CANCELS };
            let timing = Timing {
                request_id: "r1",
                deadline,
                kv_expires,
                now_ms: 5_000,
                skew_ms: 0,
            };
            let got = refusal(timing, cancels).map(|(code, _)| code);
            assert_eq!(got, want, "{cancelled} {deadline:?} {kv_expires:?}");
        }
        // A deadline's skew does not stretch the KV's life.
        let timing = Timing {
            request_id: "r1",
            deadline: None,
            kv_expires: Some(4_000),
            now_ms: 5_000,
            skew_ms: 10_000,
        };
        let (code, why) = refusal(timing, NO_CANCELS).unwrap();
        assert_eq!(code, ErrorCode::KvExpired);
        assert!(why.contains("1000 ms before the handoff"), "{why}");
    }
}
