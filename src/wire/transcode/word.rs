//! A JSON string eight bytes at a time: which bytes need more than a copy.
//! Each function flags bytes in their high bit. Only the lowest flag is
//! exact (a borrow may flag a byte above a true flag), which is all the
//! callers use: they look for any flag, or for the first.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The bytes of `w` equal to zero.
#[inline(always)]
fn zero_bytes(w: u64) -> u64 {
    w.wrapping_sub(ONES) & !w & HIGH
}

/// `"`, `\` and control characters among the bytes of `w` under 0x80 (the
/// bytes a JSON string escapes; those above are never flagged here).
#[inline(always)]
pub(super) fn escapes(w: u64) -> u64 {
    let quote = zero_bytes(w ^ (ONES * u64::from(b'"')));
    let backslash = zero_bytes(w ^ (ONES * u64::from(b'\\')));
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    quote | backslash | control
}

/// [`escapes`], and every byte that is not ASCII.
#[inline(always)]
pub(super) fn special(w: u64) -> u64 {
    escapes(w) | (w & HIGH)
}

/// The bytes of `w` that are not ASCII digits: over `'9'` (the add sets
/// their high bit), under `'0'` (the subtraction borrows), or not ASCII.
#[inline(always)]
fn non_digits(w: u64) -> u64 {
    (w.wrapping_add(ONES * 0x46) | w.wrapping_sub(ONES * u64::from(b'0')) | w) & HIGH
}

/// How many ASCII digits `b` has from `i` on, eight bytes a step.
#[inline(always)]
pub(super) fn digits(b: &[u8], start: usize) -> usize {
    let mut i = start;
    while let Some(chunk) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let flags = non_digits(u64::from_le_bytes(*chunk));
        if flags != 0 {
            return i - start + (flags.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i - start
        + b[i.min(b.len())..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count()
}

/// The first `"`, `\` or control character of `b` from `i` on (where a
/// string's text ends or needs more than a copy), eight bytes a step, and
/// whether every byte before it is ASCII; `None` when there is none.
#[inline(always)]
pub(super) fn text_end(b: &[u8], mut i: usize) -> Option<(usize, bool)> {
    let mut ascii = true;
    loop {
        if let Some(chunk) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
            let flags = special(u64::from_le_bytes(*chunk));
            if flags == 0 {
                i += 8;
                continue;
            }
            i += (flags.trailing_zeros() / 8) as usize;
        }
        match *b.get(i)? {
            b'"' | b'\\' | 0..0x20 => return Some((i, ascii)),
            0x80.. => ascii = false,
            _ => {}
        }
        i += 1;
    }
}

/// Whether the `n` bytes of `b` at `start` are all plain: ASCII, and none
/// is `"`, `\` or a control character (a string JSON writes as it is). The
/// last word is read whole when `b` has bytes past the string; the bytes
/// past it are taken as plain.
#[inline(always)]
pub(super) fn plain(b: &[u8], start: usize, n: usize) -> bool {
    let end = start + n;
    let word = |i: usize| b.get(i..).and_then(<[u8]>::first_chunk::<8>);
    let mut i = start;
    while i + 8 <= end {
        match word(i) {
            Some(w) if special(u64::from_le_bytes(*w)) == 0 => i += 8,
            _ => return false,
        }
    }
    if i == end {
        return true;
    }
    match word(i) {
        Some(w) => {
            let keep = (1u64 << (8 * (end - i))) - 1;
            let padded = (u64::from_le_bytes(*w) & keep) | ((ONES * u64::from(b'a')) & !keep);
            special(padded) == 0
        }
        None => b
            .get(i..end)
            .is_some_and(|rest| rest.iter().all(|&c| special(ONES * u64::from(c)) == 0)),
    }
}

/// Appends the `n` bytes of `b` at `start`: a string under 32 bytes (keys,
/// IDs) as a copy of a fixed 32 bytes cut back to `n`, which compiles to a
/// few moves instead of a call; `None` when `b` is too short.
#[inline(always)]
pub(super) fn copy(out: &mut Vec<u8>, b: &[u8], start: usize, n: usize) -> Option<()> {
    let len = out.len();
    match b.get(start..).and_then(<[u8]>::first_chunk::<32>) {
        Some(chunk) if n < 32 => {
            out.extend_from_slice(chunk);
            out.truncate(len + n);
        }
        _ => out.extend_from_slice(b.get(start..start.checked_add(n)?)?),
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_plain(c: u8) -> bool {
        c.is_ascii() && c >= 0x20 && c != b'"' && c != b'\\'
    }

    /// Each scan against a byte-by-byte one, for every byte value at every
    /// position of strings of 0 to 40 bytes, with and without bytes after.
    #[test]
    fn word_scans_agree_with_byte_scans() {
        for base in [
            &b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEF"[..],
            b"1234567890123456789012345678901234567890",
        ] {
            scan_every_byte_at_every_position(base);
        }
    }

    fn scan_every_byte_at_every_position(plain_text: &[u8]) {
        for len in 0..=40 {
            for at in 0..len.max(1) {
                for byte in 0..=255u8 {
                    let mut text = plain_text[..len].to_vec();
                    if len > 0 {
                        text[at] = byte;
                    }
                    for tail in [&b""[..], b"\"rest of the body"] {
                        let b = [&text[..], tail].concat();
                        assert_eq!(
                            plain(&b, 0, len),
                            text.iter().copied().all(is_plain),
                            "{text:?}"
                        );
                        let stop = b.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
                        let expect = stop.map(|i| (i, b[..i].is_ascii()));
                        assert_eq!(text_end(&b, 0), expect, "{text:?}");
                        let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
                        assert_eq!(digits(&b, 0), n, "{b:?}");
                        let mut out = vec![1];
                        copy(&mut out, &b, 0, len).unwrap();
                        assert_eq!(out[1..], text[..]);
                    }
                }
            }
        }
    }
}
