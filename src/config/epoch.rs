//! `id_epoch`: an RFC 3339 instant in UTC, turned into Unix milliseconds.
//!
//! A small civil-date parser instead of a date library: the only input is one
//! timestamp read once at start-up, and its rules fit on a page.
//!
//! Accepted: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+00:00|-00:00)`, with `T`/`Z`
//! in either case (RFC 3339 allows that) and a space in place of `T`
//! (RFC 3339, section 5.6, note). The fraction keeps milliseconds; further
//! digits are dropped. Years before 1970 and leap seconds (`:60`) are refused:
//! an ID timestamp counts whole Unix milliseconds.

/// Parses `text` as an RFC 3339 UTC instant; Unix milliseconds, or a sentence
/// saying what is wrong.
pub fn parse_utc_ms(text: &str) -> Result<u64, String> {
    let b = text.as_bytes();
    if b.len() < 20 {
        return Err("too short".into());
    }
    let year = digits(b, 0, 4).ok_or("the year must be four digits")?;
    expect(b, 4, b'-')?;
    let month = digits(b, 5, 2).ok_or("the month must be two digits")?;
    expect(b, 7, b'-')?;
    let day = digits(b, 8, 2).ok_or("the day must be two digits")?;
    if !matches!(b[10], b'T' | b't' | b' ') {
        return Err("the date and the time must be separated by 'T'".into());
    }
    let hour = digits(b, 11, 2).ok_or("the hour must be two digits")?;
    expect(b, 13, b':')?;
    let minute = digits(b, 14, 2).ok_or("the minute must be two digits")?;
    expect(b, 16, b':')?;
    let second = digits(b, 17, 2).ok_or("the second must be two digits")?;

    let mut pos = 19;
    let mut millis = 0u64;
    if b[pos] == b'.' {
        let start = pos + 1;
        let len = b[start..].iter().take_while(|c| c.is_ascii_digit()).count();
        if len == 0 {
            return Err("a '.' must be followed by the fraction's digits".into());
        }
        for i in 0..3 {
            millis = millis * 10
                + b.get(start + i)
                    .filter(|_| i < len)
                    .map_or(0, |d| u64::from(d - b'0'));
        }
        pos = start + len;
    }
    match &b[pos..] {
        b"Z" | b"z" | b"+00:00" | b"-00:00" => {}
        [b'+' | b'-', ..] => {
            return Err("the offset must be UTC ('Z' or '+00:00'); every worker of a fleet must count from the same instant".into());
        }
        _ => return Err("it must end with 'Z' (UTC)".into()),
    }

    if year < 1970 {
        return Err("the year must be 1970 or later".into());
    }
    if !(1..=12).contains(&month) {
        return Err(format!("month {month} does not exist"));
    }
    if day < 1 || day > days_in_month(year, month) {
        return Err(format!("{year:04}-{month:02} has no day {day}"));
    }
    if hour > 23 || minute > 59 {
        return Err(format!("{hour:02}:{minute:02} is not a time of day"));
    }
    if second > 59 {
        return Err("leap seconds (:60) are not accepted".into());
    }

    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3_600 + minute * 60 + second;
    Ok(secs * 1_000 + millis)
}

fn digits(b: &[u8], at: usize, len: usize) -> Option<u64> {
    let s = b.get(at..at + len)?;
    s.iter().try_fold(0u64, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + u64::from(c - b'0'))
    })
}

fn expect(b: &[u8], at: usize, want: u8) -> Result<(), String> {
    if b.get(at) == Some(&want) {
        Ok(())
    } else {
        Err(format!(
            "expected '{}' at position {}",
            want as char,
            at + 1
        ))
    }
}

fn is_leap(year: u64) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given date (proleptic Gregorian; year >= 1970).
/// Howard Hinnant's `days_from_civil`, restricted to non-negative years.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_from_civil_matches_known_dates() {
        let cases = [
            ((1970, 1, 1), 0),
            ((1970, 1, 2), 1),
            ((1971, 1, 1), 365),
            ((2000, 3, 1), 11_017),
            ((2025, 1, 1), 20_089),
        ];
        for ((y, m, d), days) in cases {
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }

    #[test]
    fn consecutive_days_are_one_apart_for_four_centuries() {
        let mut prev = days_from_civil(1970, 1, 1);
        for year in 1970..2370 {
            for month in 1..=12 {
                for day in 1..=days_in_month(year, month) {
                    if (year, month, day) == (1970, 1, 1) {
                        continue;
                    }
                    let now = days_from_civil(year, month, day);
                    assert_eq!(now, prev + 1, "{year}-{month}-{day}");
                    prev = now;
                }
            }
        }
    }
}
