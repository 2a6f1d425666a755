//! A structural check of MessagePack bytes before they are decoded.
//!
//! rmpv reads the never-used marker `0xc1` as nil, so a corrupt byte could
//! turn a field into a null (and a `ctx_request_id` into "missing") instead
//! of making the message malformed. rmpv also counts depth in its own units.
//! This walk, which allocates nothing but a small stack, refuses every
//! undefined marker, every length that runs past the end, nesting deeper than
//! [`MAX_DEPTH`] containers and trailing bytes, with the offset of the fault.

use super::{MAX_DEPTH, WireError};

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
