//! MessagePack bytes in and out, where rmpv alone is not exact enough.
//!
//! Reading: rmpv reads the never-used marker `0xc1` as nil, so a corrupt byte
//! could turn a field into a null (and a `ctx_request_id` into "missing")
//! instead of making the message malformed; it counts depth in its own units;
//! and it reads through `io::Read`, growing every array one push at a time.
//! [`read`] works on the slice in one pass: it refuses every undefined
//! marker, every length that runs past the end, nesting deeper than
//! [`MAX_DEPTH`] containers and trailing bytes, naming the offset of the
//! fault, and sizes each array and map from its header (bounded, so that a
//! lying header cannot reserve memory the body does not back).
//!
//! Writing: rmpv writes a string that is not valid UTF-8 as binary, which
//! changes its type for the decode worker. [`write`] writes it as a string
//! with its bytes unchanged; everything else is written as rmpv would, in the
//! shortest encoding.

use super::{MAX_DEPTH, WireError};
use rmp::encode;
use rmpv::Value;

/// The most items reserved up front for one array or map; larger ones grow.
const MAX_RESERVE: usize = 1024;

/// Reads exactly one MessagePack value from `bytes`.
pub fn read(bytes: &[u8]) -> Result<Value, WireError> {
    let mut reader = Reader { bytes, pos: 0 };
    let value = reader.value(0)?;
    if reader.pos < bytes.len() {
        return Err(WireError::TrailingBytes(bytes.len() - reader.pos));
    }
    Ok(value)
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// The next `n` bytes; `at` is where the value being read started.
    fn take(&mut self, n: usize, at: usize) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| truncated(at))?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, at: usize) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, at)?);
        Ok(out)
    }

    /// A big-endian length of `width` bytes (1, 2 or 4).
    fn len(&mut self, width: usize, at: usize) -> Result<usize, WireError> {
        Ok(self
            .take(width, at)?
            .iter()
            .fold(0usize, |n, b| (n << 8) | usize::from(*b)))
    }

    /// One value; `depth` is the number of containers it sits in.
    fn value(&mut self, depth: usize) -> Result<Value, WireError> {
        let at = self.pos;
        let marker = self.take(1, at)?[0];
        Ok(match marker {
            0x00..=0x7f => Value::from(marker),
            0xe0..=0xff => Value::from(marker as i8),
            0x80..=0x8f => self.map(usize::from(marker & 0x0f), depth, at)?,
            0x90..=0x9f => self.items(usize::from(marker & 0x0f), depth, at)?,
            0xa0..=0xbf => self.string(usize::from(marker & 0x1f), at)?,
            0xc0 => Value::Nil,
            0xc1 => {
                return Err(WireError::MsgPack(format!(
                    "byte {at} is 0xc1, a marker MessagePack never uses"
                )));
            }
            0xc2 => Value::Boolean(false),
            0xc3 => Value::Boolean(true),
            0xc4..=0xc6 => {
                let n = self.len(1 << (marker - 0xc4), at)?;
                Value::Binary(self.take(n, at)?.to_vec())
            }
            0xc7..=0xc9 => {
                let n = self.len(1 << (marker - 0xc7), at)?;
                self.ext(n, at)?
            }
            0xca => Value::F32(f32::from_be_bytes(self.array(at)?)),
            0xcb => Value::F64(f64::from_be_bytes(self.array(at)?)),
            0xcc => Value::from(self.take(1, at)?[0]),
            0xcd => Value::from(u16::from_be_bytes(self.array(at)?)),
            0xce => Value::from(u32::from_be_bytes(self.array(at)?)),
            0xcf => Value::from(u64::from_be_bytes(self.array(at)?)),
            0xd0 => Value::from(self.take(1, at)?[0] as i8),
            0xd1 => Value::from(i16::from_be_bytes(self.array(at)?)),
            0xd2 => Value::from(i32::from_be_bytes(self.array(at)?)),
            0xd3 => Value::from(i64::from_be_bytes(self.array(at)?)),
            0xd4..=0xd8 => self.ext(1 << (marker - 0xd4), at)?,
            0xd9..=0xdb => {
                let n = self.len(1 << (marker - 0xd9), at)?;
                self.string(n, at)?
            }
            0xdc | 0xdd => {
                let n = self.len(2 << (marker - 0xdc), at)?;
                self.items(n, depth, at)?
            }
            0xde | 0xdf => {
                let n = self.len(2 << (marker - 0xde), at)?;
                self.map(n, depth, at)?
            }
        })
    }

    fn string(&mut self, n: usize, at: usize) -> Result<Value, WireError> {
        let raw = self.take(n, at)?;
        Ok(match std::str::from_utf8(raw) {
            Ok(s) => Value::from(s),
            Err(_) => invalid_utf8_string(raw),
        })
    }

    fn ext(&mut self, n: usize, at: usize) -> Result<Value, WireError> {
        let tag = self.take(1, at)?[0] as i8;
        Ok(Value::Ext(tag, self.take(n, at)?.to_vec()))
    }

    /// Room for `n` items, each at least `min_bytes` long, without trusting
    /// `n` further than the bytes left can back it.
    fn reserve(&self, n: usize, min_bytes: usize, at: usize) -> Result<usize, WireError> {
        let left = self.bytes.len() - self.pos;
        if n > left / min_bytes {
            return Err(truncated(at));
        }
        Ok(n.min(MAX_RESERVE))
    }

    fn enter(depth: usize) -> Result<usize, WireError> {
        if depth >= MAX_DEPTH {
            return Err(WireError::TooDeep);
        }
        Ok(depth + 1)
    }

    fn items(&mut self, n: usize, depth: usize, at: usize) -> Result<Value, WireError> {
        let inner = Self::enter(depth)?;
        let mut items = Vec::with_capacity(self.reserve(n, 1, at)?);
        for _ in 0..n {
            items.push(self.value(inner)?);
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, n: usize, depth: usize, at: usize) -> Result<Value, WireError> {
        let inner = Self::enter(depth)?;
        let mut entries = Vec::with_capacity(self.reserve(n, 2, at)?);
        for _ in 0..n {
            let key = self.value(inner)?;
            let value = self.value(inner)?;
            entries.push((key, value));
        }
        Ok(Value::Map(entries))
    }
}

/// A string value holding bytes that are not UTF-8. rmpv has no public
/// constructor for one, so its own decoder builds it from a str32 header.
fn invalid_utf8_string(raw: &[u8]) -> Value {
    let mut buf = Vec::with_capacity(raw.len() + 5);
    buf.push(0xdb);
    buf.extend_from_slice(&(raw.len() as u32).to_be_bytes());
    buf.extend_from_slice(raw);
    // The header is well-formed, so rmpv cannot fail here; binary is the
    // nearest stand-in should it ever.
    rmpv::decode::read_value(&mut &buf[..]).unwrap_or_else(|_| Value::Binary(raw.to_vec()))
}

fn truncated(at: usize) -> WireError {
    WireError::MsgPack(format!(
        "the value starting at byte {at} runs past the end of the body (truncated)"
    ))
}

/// Appends the MessagePack encoding of `value` to `out`. The markers and
/// lengths are rmp's (`rmp::encode`, each in its shortest form, as rmpv
/// writes them); only the walk over the tree and the string rule are ours.
pub fn write(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Nil => infallible(encode::write_nil(out)),
        Value::Boolean(b) => infallible(encode::write_bool(out, *b)),
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => write_uint(out, u),
            (None, Some(n)) => infallible(encode::write_sint(out, n)),
            (None, None) => infallible(encode::write_nil(out)),
        },
        Value::F32(f) => infallible(encode::write_f32(out, *f)),
        Value::F64(f) => infallible(encode::write_f64(out, *f)),
        Value::String(s) => write_str(out, s.as_bytes()),
        Value::Binary(bytes) => {
            infallible(encode::write_bin_len(out, len32(bytes.len())));
            out.extend_from_slice(bytes);
        }
        Value::Array(items) => {
            infallible(encode::write_array_len(out, len32(items.len())));
            for item in items {
                write(out, item);
            }
        }
        Value::Map(entries) => {
            write_map_len(out, entries.len());
            for (k, v) in entries {
                write(out, k);
                write(out, v);
            }
        }
        Value::Ext(tag, data) => {
            infallible(encode::write_ext_meta(out, len32(data.len()), *tag));
            out.extend_from_slice(data);
        }
    }
}

/// Appends a string's header and bytes (which need not be UTF-8), as
/// [`write()`] writes a string value.
pub fn write_str(out: &mut Vec<u8>, bytes: &[u8]) {
    // The short forms by hand, the rest through rmp: a decode job writes
    // about twenty strings, and rmp's writer returns a `Result` per byte
    // written (`docs/performance.md`, "Figures behind choices in the code").
    match bytes.len() {
        n @ 0..32 => out.push(0xa0 | n as u8),
        n @ 32..256 => out.extend_from_slice(&[0xd9, n as u8]),
        n => infallible(encode::write_str_len(out, len32(n))),
    }
    out.extend_from_slice(bytes);
}

/// Appends the header of a map of `n` entries, as [`write()`] writes it.
#[inline]
pub fn write_map_len(out: &mut Vec<u8>, n: usize) {
    match n {
        0..16 => out.push(0x80 | n as u8),
        _ => infallible(encode::write_map_len(out, len32(n))),
    }
}

/// Appends a non-negative integer in its shortest form, as [`write()`] does
/// (rmp's `write_uint`, by hand: its writer returns a `Result` per byte, and
/// a decode job writes two or three of these).
pub fn write_uint(out: &mut Vec<u8>, n: u64) {
    match n {
        0..0x80 => out.push(n as u8),
        0x80..0x100 => out.extend_from_slice(&[0xcc, n as u8]),
        0x100..0x1_0000 => {
            let [a, b] = (n as u16).to_be_bytes();
            out.extend_from_slice(&[0xcd, a, b]);
        }
        0x1_0000..0x1_0000_0000 => {
            let [a, b, c, d] = (n as u32).to_be_bytes();
            out.extend_from_slice(&[0xce, a, b, c, d]);
        }
        _ => {
            // One write of nine bytes, not a push and a write of eight: a
            // minted ID is this wide, and a decode job carries it twice.
            let mut encoded = [0xcf; 9];
            encoded[1..].copy_from_slice(&n.to_be_bytes());
            out.extend_from_slice(&encoded);
        }
    }
}

/// A length as MessagePack carries it. Lengths past 32 bits cannot occur:
/// every value comes from a message bounded far below 4 GiB.
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Writing into a `Vec` cannot fail; rmp's signatures are for any writer.
fn infallible<T, E>(written: Result<T, E>) {
    debug_assert!(written.is_ok(), "writing MessagePack into a Vec failed");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The short forms written by hand are rmp's, at every length around
    /// each boundary.
    #[test]
    fn headers_written_by_hand_are_rmps() {
        for n in (0..300).chain([65_535, 65_536, 70_000]) {
            let s = vec![b'x'; n];
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            write_str(&mut ours, &s);
            encode::write_str(&mut theirs, std::str::from_utf8(&s).unwrap()).unwrap();
            assert_eq!(ours, theirs, "string of {n} bytes");
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            write_map_len(&mut ours, n);
            encode::write_map_len(&mut theirs, n as u32).unwrap();
            assert_eq!(ours, theirs, "map of {n} entries");
        }
    }

    /// `write_uint` is rmp's at every width's edges.
    #[test]
    fn integers_written_by_hand_are_rmps() {
        let edges = [0x80u64, 0x100, 0x1_0000, 0x1_0000_0000];
        let around = edges.iter().flat_map(|e| [e - 1, *e, e + 1]).chain([
            0,
            1,
            u64::MAX - 1,
            u64::MAX,
            (1 << 63) - 1,
        ]);
        for n in around {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            write_uint(&mut ours, n);
            encode::write_uint(&mut theirs, n).unwrap();
            assert_eq!(ours, theirs, "{n}");
        }
    }
}
