//! Canonical MessagePack in, compact JSON out, with no value tree: what
//! [`crate::wire::encode`] writes for the same value as JSON (serde_json's
//! compact form: its string escapes, its integer and float forms).
//!
//! Meant for outputs the in-place decision wrote from a JSON input, which
//! hold only what JSON can carry. Anything else (binary, ext, a key that is
//! not a string, bytes that do not parse) is an error: the caller answers
//! it, and nothing stands in for the value.

use super::{raw, word};
use crate::wire::NotJson;

/// The JSON form of the MessagePack value `mp`, or where in it is a value
/// JSON cannot carry.
pub fn msgpack_to_json(mp: &[u8], capacity: usize) -> Result<Vec<u8>, NotJson> {
    let mut out = Vec::with_capacity(capacity);
    let mut p = 0;
    match value(mp, &mut p, &mut out) {
        Some(()) if p == mp.len() => Ok(out),
        Some(()) => Err(NotJson(format!(
            "it holds {} bytes after one complete value",
            mp.len() - p
        ))),
        None => Err(NotJson(format!(
            "it holds a value JSON cannot carry (binary, ext, a key that is not a string) or bytes that do not parse, before byte {} of {}",
            p.min(mp.len()),
            mp.len()
        ))),
    }
}

/// The `N` bytes at `p`, big-endian, moving `p` past them.
#[inline(always)]
fn be<const N: usize>(b: &[u8], p: &mut usize) -> Option<u64> {
    let raw = b.get(*p..)?.first_chunk::<N>()?;
    *p += N;
    Some(raw.iter().fold(0u64, |n, x| (n << 8) | u64::from(*x)))
}

fn value(b: &[u8], p: &mut usize, out: &mut Vec<u8>) -> Option<()> {
    let marker = *b.get(*p)?;
    *p += 1;
    match marker {
        0x00..=0x7f => uint(out, u64::from(marker)),
        0xe0..=0xff => int(out, i64::from(marker as i8)),
        0xc0 => out.extend_from_slice(b"null"),
        0xc2 => out.extend_from_slice(b"false"),
        0xc3 => out.extend_from_slice(b"true"),
        0xcc => uint(out, be::<1>(b, p)?),
        0xcd => uint(out, be::<2>(b, p)?),
        0xce => uint(out, be::<4>(b, p)?),
        0xcf => uint(out, be::<8>(b, p)?),
        0xd0 => int(out, i64::from(be::<1>(b, p)? as i8)),
        0xd1 => int(out, i64::from(be::<2>(b, p)? as i16)),
        0xd2 => int(out, i64::from(be::<4>(b, p)? as i32)),
        0xd3 => int(out, be::<8>(b, p)? as i64),
        0xca => {
            let f = f32::from_bits(be::<4>(b, p)? as u32);
            serde_json::to_writer(&mut *out, &f).ok()?;
        }
        0xcb => {
            let f = f64::from_bits(be::<8>(b, p)?);
            serde_json::to_writer(&mut *out, &f).ok()?;
        }
        0xa0..=0xbf => string(b, p, usize::from(marker & 0x1f), out)?,
        0x90..=0x9f => array(b, p, usize::from(marker & 0x0f), out)?,
        0x80..=0x8f => map(b, p, usize::from(marker & 0x0f), out)?,
        0xd9..=0xdf => {
            let n = match marker {
                0xd9 => be::<1>(b, p)?,
                0xda | 0xdc | 0xde => be::<2>(b, p)?,
                _ => be::<4>(b, p)?,
            } as usize;
            match marker {
                0xd9..=0xdb => string(b, p, n, out)?,
                0xdc | 0xdd => array(b, p, n, out)?,
                _ => map(b, p, n, out)?,
            }
        }
        // JSON text carried through (`raw`): fixext 1 to 16, ext 8/16/32.
        0xd4..=0xd8 | 0xc7..=0xc9 => {
            let (text, len) = raw::carried_at(&b[*p - 1..])?;
            out.extend_from_slice(text);
            *p += len - 1;
        }
        // Binary, other ext types and the undefined marker: not from JSON.
        _ => return None,
    }
    Some(())
}

fn array(b: &[u8], p: &mut usize, n: usize, out: &mut Vec<u8>) -> Option<()> {
    out.push(b'[');
    for i in 0..n {
        if i > 0 {
            out.push(b',');
        }
        value(b, p, out)?;
    }
    out.push(b']');
    Some(())
}

fn map(b: &[u8], p: &mut usize, n: usize, out: &mut Vec<u8>) -> Option<()> {
    out.push(b'{');
    for i in 0..n {
        if i > 0 {
            out.push(b',');
        }
        if !plain_key(b, p, out) {
            // Keys are strings: anything else is not from JSON.
            let marker = *b.get(*p)?;
            if !matches!(marker, 0xa0..=0xbf | 0xd9..=0xdb) {
                return None;
            }
            value(b, p, out)?;
            out.push(b':');
        }
        value(b, p, out)?;
    }
    out.push(b'}');
    Some(())
}

/// The usual key, a fixstr with nothing to escape, written with its colon
/// in one copy (its marker's place taking the opening quote); `false`,
/// with nothing written, for any other.
#[inline(always)]
fn plain_key(b: &[u8], p: &mut usize, out: &mut Vec<u8>) -> bool {
    let Some(&marker) = b.get(*p) else {
        return false;
    };
    let n = usize::from(marker & 0x1f);
    if marker & 0xe0 != 0xa0 || !word::plain(b, *p + 1, n) {
        return false;
    }
    let at = out.len();
    if word::copy(out, b, *p, n + 1).is_none() {
        return false;
    }
    out[at] = b'"';
    out.extend_from_slice(b"\":");
    *p += 1 + n;
    true
}

/// A string of `n` bytes at `p`, quoted and escaped as serde_json escapes
/// it: `"` and `\` with a backslash, control characters as `\b`, `\t`,
/// `\n`, `\f`, `\r` or `\u00xx`, everything else as it is.
fn string(b: &[u8], p: &mut usize, n: usize, out: &mut Vec<u8>) -> Option<()> {
    let end = p.checked_add(n)?;
    // Most strings (keys, subjects, IDs) are ASCII with nothing to escape:
    // found in one pass, eight bytes a step, copied whole.
    if word::plain(b, *p, n) {
        out.push(b'"');
        word::copy(out, b, *p, n)?;
        out.push(b'"');
        *p = end;
        return Some(());
    }
    let bytes = b.get(*p..end)?;
    if !bytes.is_ascii() {
        std::str::from_utf8(bytes).ok()?;
    }
    *p = end;
    out.push(b'"');
    // Most strings (a base64 state, subjects, IDs) need no escape: found
    // eight bytes a step, they are copied whole.
    if !needs_escape(bytes) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return Some(());
    }
    let mut run = 0;
    for (i, &c) in bytes.iter().enumerate() {
        let escape: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            0..0x20 => {
                out.extend_from_slice(&bytes[run..i]);
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let code = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(c >> 4)],
                    HEX[usize::from(c & 0xf)],
                ];
                out.extend_from_slice(&code);
                run = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        out.extend_from_slice(escape);
        run = i + 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
    Some(())
}

/// Whether any byte of `bytes` is `"`, `\\` or a control character.
fn needs_escape(bytes: &[u8]) -> bool {
    let (words, rest) = bytes.as_chunks::<8>();
    let special = |c: &u8| matches!(c, b'"' | b'\\' | 0..0x20);
    words
        .iter()
        .any(|chunk| word::escapes(u64::from_le_bytes(*chunk)) != 0)
        || rest.iter().any(special)
}

/// A non-negative integer in decimal, two digits a step.
fn uint(out: &mut Vec<u8>, mut n: u64) {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    while n >= 100 {
        let pair = usize::from((n % 100) as u8) * 2;
        n /= 100;
        at -= 2;
        buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        at -= 2;
        buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        at -= 1;
        buf[at] = b'0' + n as u8;
    }
    out.extend_from_slice(&buf[at..]);
}

fn int(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    uint(out, n.unsigned_abs());
}
