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
