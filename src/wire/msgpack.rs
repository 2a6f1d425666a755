//! MessagePack bytes in and out, where rmpv alone is not exact enough.
//!
//! Reading: rmpv reads the never-used marker `0xc1` as nil, so a corrupt byte could
//! turn a field into a null (and a `ctx_request_id` into "missing") instead
//! of making the message malformed. rmpv also counts depth in its own units.
//! This walk, which allocates nothing but a small stack, refuses every
//! undefined marker, every length that runs past the end, nesting deeper than
//! [`MAX_DEPTH`] containers and trailing bytes, with the offset of the fault.
//!
//! Writing: rmpv writes a string that is not valid UTF-8 as binary, which
//! changes its type for the decode worker. [`write`] writes it as a string
//! with its bytes unchanged; everything else is written as rmpv would, in the
//! shortest encoding.

use super::{MAX_DEPTH, WireError};
use rmpv::Value;

/// Checks that `bytes` hold exactly one well-formed MessagePack value.
pub fn check(bytes: &[u8]) -> Result<(), WireError> {
    let mut pos = 0usize;
    // Items still to read in each open container; the bottom entry is the
    // single top-level value.
    let mut open: Vec<u64> = Vec::with_capacity(8);
    open.push(1);
    while let Some(left) = open.last_mut() {
        if *left == 0 {
            open.pop();
            continue;
        }
        *left -= 1;
        let at = pos;
        let marker = *bytes.get(pos).ok_or_else(|| truncated(at))?;
        pos += 1;
        let (skip, items) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * u64::from(marker & 0x0f)),
            0x90..=0x9f => (0, u64::from(marker & 0x0f)),
            0xa0..=0xbf => (usize::from(marker & 0x1f), 0),
            0xc1 => {
                return Err(WireError::MsgPack(format!(
                    "byte {at} is 0xc1, a marker MessagePack never uses"
                )));
            }
            0xc4 | 0xd9 => (len(bytes, &mut pos, 1)?, 0),
            0xc5 | 0xda => (len(bytes, &mut pos, 2)?, 0),
            0xc6 | 0xdb => (len(bytes, &mut pos, 4)?, 0),
            // ext: length, then a type byte, then the data.
            0xc7 => (len(bytes, &mut pos, 1)? + 1, 0),
            0xc8 => (len(bytes, &mut pos, 2)? + 1, 0),
            0xc9 => (len(bytes, &mut pos, 4)? + 1, 0),
            0xca => (4, 0),
            0xcb => (8, 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xce | 0xd2 => (4, 0),
            0xcf | 0xd3 => (8, 0),
            // fixext 1, 2, 4, 8, 16: a type byte, then the data.
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xdc => (0, len(bytes, &mut pos, 2)? as u64),
            0xdd => (0, len(bytes, &mut pos, 4)? as u64),
            0xde => (0, 2 * len(bytes, &mut pos, 2)? as u64),
            0xdf => (0, 2 * len(bytes, &mut pos, 4)? as u64),
        };
        pos = pos
            .checked_add(skip)
            .filter(|end| *end <= bytes.len())
            .ok_or_else(|| truncated(at))?;
        let is_container = matches!(marker, 0x80..=0x9f | 0xdc..=0xdf);
        if is_container {
            // `open` holds the top-level slot plus one entry per container
            // this value sits in.
            if open.len() > MAX_DEPTH {
                return Err(WireError::TooDeep);
            }
            // Every item takes at least one byte: a count beyond the bytes
            // left is a truncation, found here rather than item by item.
            if items > (bytes.len() - pos) as u64 {
                return Err(truncated(at));
            }
            open.push(items);
        }
    }
    if pos < bytes.len() {
        return Err(WireError::TrailingBytes(bytes.len() - pos));
    }
    Ok(())
}

/// Reads a big-endian length of `width` bytes.
fn len(bytes: &[u8], pos: &mut usize, width: usize) -> Result<usize, WireError> {
    let at = *pos;
    let field = bytes.get(at..at + width).ok_or_else(|| truncated(at - 1))?;
    *pos += width;
    Ok(field.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b)))
}

fn truncated(at: usize) -> WireError {
    WireError::MsgPack(format!(
        "the value starting at byte {at} runs past the end of the body (truncated)"
    ))
}

/// Appends the MessagePack encoding of `value` to `out`.
pub fn write(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Nil => out.push(0xc0),
        Value::Boolean(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => write_uint(out, u),
            (None, Some(n)) => write_negative(out, n),
            (None, None) => out.push(0xc0),
        },
        Value::F32(f) => {
            out.push(0xca);
            out.extend_from_slice(&f.to_be_bytes());
        }
        Value::F64(f) => {
            out.push(0xcb);
            out.extend_from_slice(&f.to_be_bytes());
        }
        Value::String(s) => {
            let bytes = s.as_bytes();
            write_len(out, bytes.len(), Some(0xa0), [0xd9, 0xda, 0xdb]);
            out.extend_from_slice(bytes);
        }
        Value::Binary(bytes) => {
            write_len(out, bytes.len(), None, [0xc4, 0xc5, 0xc6]);
            out.extend_from_slice(bytes);
        }
        Value::Array(items) => {
            write_container_len(out, items.len(), 0x90, [0xdc, 0xdd]);
            for item in items {
                write(out, item);
            }
        }
        Value::Map(entries) => {
            write_container_len(out, entries.len(), 0x80, [0xde, 0xdf]);
            for (k, v) in entries {
                write(out, k);
                write(out, v);
            }
        }
        Value::Ext(tag, data) => {
            match data.len() {
                1 => out.push(0xd4),
                2 => out.push(0xd5),
                4 => out.push(0xd6),
                8 => out.push(0xd7),
                16 => out.push(0xd8),
                n => write_len(out, n, None, [0xc7, 0xc8, 0xc9]),
            }
            out.push(*tag as u8);
            out.extend_from_slice(data);
        }
    }
}

fn write_uint(out: &mut Vec<u8>, n: u64) {
    if n < 0x80 {
        out.push(n as u8);
    } else if n <= u64::from(u8::MAX) {
        out.extend_from_slice(&[0xcc, n as u8]);
    } else if n <= u64::from(u16::MAX) {
        out.push(0xcd);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n <= u64::from(u32::MAX) {
        out.push(0xce);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// A negative integer (non-negative ones go through [`write_uint`]).
fn write_negative(out: &mut Vec<u8>, n: i64) {
    if n >= -32 {
        out.push(n as i8 as u8);
    } else if n >= i64::from(i8::MIN) {
        out.extend_from_slice(&[0xd0, n as i8 as u8]);
    } else if n >= i64::from(i16::MIN) {
        out.push(0xd1);
        out.extend_from_slice(&(n as i16).to_be_bytes());
    } else if n >= i64::from(i32::MIN) {
        out.push(0xd2);
        out.extend_from_slice(&(n as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// The length of a string (with a fix form for up to 31 bytes), binary or
/// ext: markers for 8-, 16- and 32-bit lengths. Lengths past 32 bits cannot
/// occur: every value comes from a bounded message.
fn write_len(out: &mut Vec<u8>, n: usize, fix: Option<u8>, markers: [u8; 3]) {
    match fix {
        Some(fix) if n < 32 => out.push(fix | n as u8),
        _ if n <= usize::from(u8::MAX) => out.extend_from_slice(&[markers[0], n as u8]),
        _ if n <= usize::from(u16::MAX) => {
            out.push(markers[1]);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            out.push(markers[2]);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
}

fn write_container_len(out: &mut Vec<u8>, n: usize, fix: u8, markers: [u8; 2]) {
    if n < 16 {
        out.push(fix | n as u8);
    } else if n <= usize::from(u16::MAX) {
        out.push(markers[0]);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(markers[1]);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}
