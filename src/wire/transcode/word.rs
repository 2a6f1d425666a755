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
