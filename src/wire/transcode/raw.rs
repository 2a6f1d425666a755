//! JSON text carried through unchanged: the values of a result's `request`
//! map, which the decision copies without reading. A value whose text is
//! already what writing it back would give (compact, strings without
//! escapes, integers the value tree holds as integers, floats in the form
//! serde_json writes) is carried as a MessagePack ext value of type
//! [`RAW_JSON`] holding that text, and written back as it is; any other
//! value is converted token by token as before.
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
/// containers around it); `None` otherwise.
pub(super) fn canonical_end(b: &[u8], start: usize, depth: usize) -> Option<usize> {
    match *b.get(start)? {
        b'{' => object_end(b, start, depth + 1),
        b'[' => array_end(b, start, depth + 1),
        b'"' => string_end(b, start),
        b't' => literal_end(b, start, b"true"),
        b'f' => literal_end(b, start, b"false"),
        b'n' => literal_end(b, start, b"null"),
        _ => number_end(b, start),
    }
}

fn literal_end(b: &[u8], start: usize, word: &[u8]) -> Option<usize> {
    let end = start + word.len();
    (b.get(start..end)? == word).then_some(end)
}

fn object_end(b: &[u8], start: usize, depth: usize) -> Option<usize> {
    items_end(b, start, depth, b'}', |i| {
        if *b.get(i)? != b'"' {
            return None;
        }
        let i = string_end(b, i)?;
        if *b.get(i)? != b':' {
            return None;
        }
        canonical_end(b, i + 1, depth)
    })
}

fn array_end(b: &[u8], start: usize, depth: usize) -> Option<usize> {
    // Token IDs, the usual items: a plain integer read here.
    items_end(b, start, depth, b']', |i| {
        plain_uint_end(b, i).or_else(|| canonical_end(b, i, depth))
    })
}

/// The end of the container opened at `start`, at nesting level `depth`:
/// items read by `item` (from where one starts to where it ends),
/// separated by commas, up to `close`.
#[inline(always)]
fn items_end(
    b: &[u8],
    start: usize,
    depth: usize,
    close: u8,
    item: impl Fn(usize) -> Option<usize>,
) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut i = start + 1;
    if *b.get(i)? == close {
        return Some(i + 1);
    }
    loop {
        i = item(i)?;
        match *b.get(i)? {
            b',' => i += 1,
            c if c == close => return Some(i + 1),
            _ => return None,
        }
    }
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
    let digits = b
        .get(first..)?
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    let end = first + digits;
    if digits == 0 || (digits > 1 && b[first] == b'0') {
        return None;
    }
    if !matches!(b.get(end), Some(b'.' | b'e' | b'E')) {
        // Not a plain non-negative integer: a negative one the tree holds
        // as an integer, or none.
        return (negative && digits <= 18 && b[first] != b'0').then_some(end);
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

/// The JSON text of a MessagePack value that is an ext of type
/// [`RAW_JSON`] (the whole of `mp`), or `None` for any other value.
pub fn carried(mp: &[u8]) -> Option<&[u8]> {
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
    let text = mp.get(at + 1..)?;
    (text.len() == len).then_some(text)
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
