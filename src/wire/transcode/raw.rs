//! JSON text carried through unchanged: the values the decision copies
//! without reading (a [`super::Plan`] names them). A value whose text is
//! already what writing it back would give (compact, strings without
//! escapes, integers the value tree holds as integers, floats in the form
//! serde_json writes), or is once the whitespace between its tokens is taken
//! out, is carried as a MessagePack ext value of type [`RAW_JSON`] holding
//! that text, and written back as it is; any other value is converted token
//! by token.
//!
//! Only JSON input produces this ext type here, and only JSON output reads
//! it: a MessagePack result is never converted, so an ext value a producer
//! sends keeps its meaning.

use super::word;
use crate::wire::MAX_DEPTH;

/// The ext type of a value carried as its JSON text.
pub(super) const RAW_JSON: u8 = 0x4a;

/// The end of the value at `start` when its text is the canonical compact
/// JSON of that value and it sits within the depth bound (`depth`
/// containers around it); `None` otherwise. With `SPACED`, whitespace
/// between tokens is allowed too (the text is then canonical once
/// [`compact`]ed).
pub(super) fn canonical_end<const SPACED: bool>(
    b: &[u8],
    start: usize,
    depth: usize,
) -> Option<usize> {
    match *b.get(start)? {
        b'{' => object_end::<SPACED>(b, start, depth + 1),
        b'[' => array_end::<SPACED>(b, start, depth + 1),
        b'"' => string_end(b, start),
        b't' => literal_end(b, start, b"true"),
        b'f' => literal_end(b, start, b"false"),
        b'n' => literal_end(b, start, b"null"),
        _ => number_end(b, start),
    }
}

/// `i` past any JSON whitespace there, with `SPACED`; `i` otherwise.
#[inline(always)]
fn skip<const SPACED: bool>(b: &[u8], mut i: usize) -> usize {
    if SPACED {
        while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            i += 1;
        }
    }
    i
}

fn literal_end(b: &[u8], start: usize, word: &[u8]) -> Option<usize> {
    let end = start + word.len();
    (b.get(start..end)? == word).then_some(end)
}

fn object_end<const SPACED: bool>(b: &[u8], start: usize, depth: usize) -> Option<usize> {
    items_end::<SPACED>(b, start, depth, b'}', |i| {
        if *b.get(i)? != b'"' {
            return None;
        }
        let i = skip::<SPACED>(b, string_end(b, i)?);
        if *b.get(i)? != b':' {
            return None;
        }
        canonical_end::<SPACED>(b, skip::<SPACED>(b, i + 1), depth)
    })
}

fn array_end<const SPACED: bool>(b: &[u8], start: usize, depth: usize) -> Option<usize> {
    // Token IDs, the usual items: an array of plain integers in one loop
    // (any other array, or one past the depth bound, read item by item).
    if depth <= MAX_DEPTH {
        let mut i = skip::<SPACED>(b, start + 1);
        loop {
            let digits = word::digits(b, i);
            if digits == 0 || digits > 19 || (digits > 1 && b[i] == b'0') {
                break;
            }
            i = skip::<SPACED>(b, i + digits);
            match b.get(i) {
                Some(b',') => i = skip::<SPACED>(b, i + 1),
                Some(b']') => return Some(i + 1),
                _ => break,
            }
        }
    }
    items_end::<SPACED>(b, start, depth, b']', |i| {
        plain_uint_end(b, i).or_else(|| canonical_end::<SPACED>(b, i, depth))
    })
}

/// The end of the container opened at `start`, at nesting level `depth`:
/// items read by `item` (from where one starts to where it ends),
/// separated by commas, up to `close`.
#[inline(always)]
fn items_end<const SPACED: bool>(
    b: &[u8],
    start: usize,
    depth: usize,
    close: u8,
    item: impl Fn(usize) -> Option<usize>,
) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut i = skip::<SPACED>(b, start + 1);
    if *b.get(i)? == close {
        return Some(i + 1);
    }
    loop {
        i = skip::<SPACED>(b, item(i)?);
        match *b.get(i)? {
            b',' => i = skip::<SPACED>(b, i + 1),
            c if c == close => return Some(i + 1),
            _ => return None,
        }
    }
}

/// `text` (a value [`canonical_end`] with `SPACED` accepted) without its
/// whitespace between tokens. Its strings have no escapes, so every quote
/// opens or closes one.
pub(super) fn compact(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut in_string = false;
    for &c in text {
        match c {
            b'"' => in_string = !in_string,
            b' ' | b'\t' | b'\n' | b'\r' if !in_string => continue,
            _ => {}
        }
        out.push(c);
    }
    out
}

/// The end of a non-negative integer of 1 to 19 digits without a leading
/// zero that is not the start of a float; `None` for anything else.
#[inline(always)]
fn plain_uint_end(b: &[u8], start: usize) -> Option<usize> {
    let digits = word::digits(b, start);
    let i = start + digits;
    let plain = (1..=19).contains(&digits)
        && (digits == 1 || b[start] != b'0')
        && !matches!(b.get(i), Some(b'.' | b'e' | b'E'));
    plain.then_some(i)
}

/// A string with no escape and no control character (serde_json writes
/// every other string as it is), valid UTF-8.
fn string_end(b: &[u8], start: usize) -> Option<usize> {
    let from = start + 1;
    let (end, ascii) = word::text_end(b, from)?;
    if b[end] != b'"' {
        return None;
    }
    if !ascii {
        std::str::from_utf8(&b[from..end]).ok()?;
    }
    Some(end + 1)
}

/// An integer the value tree holds as one (at most 19 digits, or a minus
/// and at most 18 without a leading zero), or a float whose text is the
/// one serde_json writes for it.
fn number_end(b: &[u8], start: usize) -> Option<usize> {
    if let Some(end) = plain_uint_end(b, start) {
        return Some(end);
    }
    let negative = b.get(start) == Some(&b'-');
    let first = start + usize::from(negative);
    let digits = word::digits(b, first);
    let end = first + digits;
    if digits == 0 || (digits > 1 && b[first] == b'0') {
        return None;
    }
    if !matches!(b.get(end), Some(b'.' | b'e' | b'E')) {
        // Not a plain non-negative integer: a negative one the tree holds
        // as an integer, or none.
        return (negative && digits <= 18 && b[first] != b'0').then_some(end);
    }
    if let Some(end) = short_decimal_end(b, first, digits) {
        return Some(end);
    }
    let len = b[end..]
        .iter()
        .take_while(|c| matches!(c, b'0'..=b'9' | b'.' | b'e' | b'E' | b'-' | b'+'))
        .count();
    let text = &b[start..end + len];
    let value: f64 = serde_json::from_slice(text).ok()?;
    let mut written = [0u8; 32];
    let mut rest: &mut [u8] = &mut written;
    serde_json::to_writer(&mut rest, &value).ok()?;
    let n = 32 - rest.len();
    (written[..n] == *text).then_some(end + len)
}

/// The end of a float written as `int.frac` (sampling options: `0.7`,
/// `0.95`) whose text is the one serde_json writes, known without
/// converting it: the integer part (`digits` digits at `first`, no leading
/// zero) is followed by a fraction that does not end in zero, with no
/// exponent, at most 15 significant digits, and a magnitude serde_json
/// writes in this form (at least 0.001, under 10^15). A decimal of at most
/// 15 significant digits is the shortest text of the float nearest to it
/// (no two such decimals share a float), which is what serde_json writes.
/// `None` when the check does not apply; the caller converts then.
fn short_decimal_end(b: &[u8], first: usize, digits: usize) -> Option<usize> {
    let point = first + digits;
    if b.get(point) != Some(&b'.') || digits > 15 {
        return None;
    }
    let fraction = word::digits(b, point + 1);
    let end = point + 1 + fraction;
    if fraction == 0 || b[end - 1] == b'0' || matches!(b.get(end), Some(b'e' | b'E')) {
        return None;
    }
    let significant = if b[first] == b'0' {
        let zeros = b[point + 1..end].iter().take_while(|&&c| c == b'0').count();
        (zeros <= 2).then_some(fraction - zeros)?
    } else {
        digits + fraction
    };
    (significant <= 15).then_some(end)
}

/// The JSON text of a MessagePack value that is an ext of type
/// [`RAW_JSON`] (the whole of `mp`), or `None` for any other value.
pub fn carried(mp: &[u8]) -> Option<&[u8]> {
    carried_at(mp).and_then(|(text, len)| (len == mp.len()).then_some(text))
}

/// The JSON text of the ext value of type [`RAW_JSON`] that `mp` starts
/// with, and that value's length in bytes; `None` for any other value.
#[inline]
pub(super) fn carried_at(mp: &[u8]) -> Option<(&[u8], usize)> {
    let (len, at) = match *mp.first()? {
        marker @ 0xd4..=0xd8 => (1usize << (marker - 0xd4), 1),
        0xc7 => (usize::from(*mp.get(1)?), 2),
        0xc8 => (
            usize::from(u16::from_be_bytes(*mp.get(1..)?.first_chunk()?)),
            3,
        ),
        0xc9 => (
            usize::try_from(u32::from_be_bytes(*mp.get(1..)?.first_chunk()?)).ok()?,
            5,
        ),
        _ => return None,
    };
    if *mp.get(at)? != RAW_JSON {
        return None;
    }
    let end = (at + 1).checked_add(len)?;
    Some((mp.get(at + 1..end)?, end))
}

/// Appends `json` as an ext value of type [`RAW_JSON`] in its canonical
/// form; `false` (nothing written) past 4 GiB.
pub(super) fn write(out: &mut Vec<u8>, json: &[u8]) -> bool {
    let n = json.len();
    match n {
        1 => out.push(0xd4),
        2 => out.push(0xd5),
        4 => out.push(0xd6),
        8 => out.push(0xd7),
        16 => out.push(0xd8),
        _ => match (u8::try_from(n), u16::try_from(n), u32::try_from(n)) {
            (Ok(n8), _, _) => out.extend_from_slice(&[0xc7, n8]),
            (_, Ok(n16), _) => {
                out.push(0xc8);
                out.extend_from_slice(&n16.to_be_bytes());
            }
            (_, _, Ok(n32)) => {
                out.push(0xc9);
                out.extend_from_slice(&n32.to_be_bytes());
            }
            _ => return false,
        },
    }
    out.push(RAW_JSON);
    out.extend_from_slice(json);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What serde_json writes for the float a text reads as.
    fn serde_form(text: &[u8]) -> Option<Vec<u8>> {
        let value: f64 = serde_json::from_slice(text).ok()?;
        serde_json::to_vec(&value).ok()
    }

    /// Every decimal the short check accepts is written back by serde_json
    /// as it is: integer parts of 1 to 16 digits and fractions of 1 to 16,
    /// zeros where they matter most (leading, trailing, alone).
    #[test]
    fn short_decimals_are_what_serde_json_writes() {
        let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut accepted = 0;
        for _ in 0..200_000 {
            let r = next();
            let digits = |n: u64, r: u64| -> String {
                let zeros = (r >> 8) % 4;
                (0..n)
                    .map(|i| match (zeros, i) {
                        (1, 0) | (2, _) if r & (1 << i) == 0 => '0',
                        _ => char::from(b'0' + ((r >> (i * 3 % 60)) % 10) as u8),
                    })
                    .collect()
            };
            let int = digits(1 + r % 16, next());
            let frac = digits(1 + (r >> 4) % 16, next());
            let sign = if r >> 63 == 1 { "-" } else { "" };
            let text = format!("{sign}{int}.{frac}");
            let b = text.as_bytes();
            let first = usize::from(!sign.is_empty());
            let int_digits = int.len();
            if int_digits > 1 && int.starts_with('0') {
                continue;
            }
            if let Some(end) = short_decimal_end(b, first, int_digits) {
                accepted += 1;
                assert_eq!(end, b.len(), "{text}");
                assert_eq!(serde_form(b).as_deref(), Some(b), "{text}");
            }
        }
        assert!(accepted > 10_000, "only {accepted} accepted");
        // At the edges of the accepted range, and just past them.
        for (text, short) in [
            ("0.001", true),
            ("0.0001", false),
            ("0.7", true),
            ("0.70", false),
            ("1.0", false),
            ("999999999999999.9", false),
            ("99999999999999.9", true),
            ("0.123456789012345", true),
            ("0.1234567890123456", false),
            ("-0.5", true),
            ("1.5e3", false),
        ] {
            let b = text.as_bytes();
            let first = usize::from(b[0] == b'-');
            let int = word::digits(b, first);
            assert_eq!(short_decimal_end(b, first, int).is_some(), short, "{text}");
            if short {
                assert_eq!(serde_form(b).as_deref(), Some(b), "{text}");
            }
        }
    }

    #[test]
    fn carried_reads_every_ext_form_of_its_type_only_and_where_it_ends() {
        for n in [1usize, 2, 3, 4, 8, 16, 17, 255, 256, 70_000] {
            let text = vec![b'7'; n];
            let mut mp = Vec::new();
            assert!(write(&mut mp, &text));
            assert_eq!(carried(&mp), Some(&text[..]), "{n}");
            let mut other = mp.clone();
            let at = other.iter().position(|&x| x == RAW_JSON).unwrap();
            other[at] = 0x4b;
            assert_eq!(carried(&other), None, "{n}");
            assert_eq!(carried(&mp[..mp.len() - 1]), None, "{n}");
            // Followed by another value: read at the start, not as the whole.
            let mut longer = mp.clone();
            longer.push(0xc0);
            assert_eq!(carried_at(&longer), Some((&text[..], mp.len())), "{n}");
            assert_eq!(carried(&longer), None, "{n}");
        }
        assert_eq!(carried(&[0xa1, b'x']), None);
        assert_eq!(carried(&[]), None);
    }
}
