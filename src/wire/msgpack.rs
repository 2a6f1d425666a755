//! MessagePack bytes in and out, where rmpv alone is not exact enough.
//!
//! Reading: rmpv reads the never-used marker `0xc1` as nil, so a corrupt byte
//! could turn a field into a null (and a `ctx_request_id` into "missing")
//! instead of making the message malformed; it counts depth in its own units;
//! and it reads through `io::Read`, growing every array one push at a time.
//! [`read`] builds the tree on [`scan::head`], the crate's one statement of
//! the format: it refuses every undefined marker, every length that runs
//! past the end, nesting deeper than [`super::MAX_DEPTH`] containers and
//! trailing bytes, naming the offset of the fault, and sizes each array and
//! map from its header (bounded, so that a lying header cannot reserve
//! memory the body does not back).
//!
//! Writing: rmpv writes a string that is not valid UTF-8 as binary, which
//! changes its type for the decode worker. [`write`] writes it as a string
//! with its bytes unchanged; everything else is written as rmpv would, in the
//! shortest encoding.

use super::WireError;
use super::scan::{self, Fault, Kind};
use rmp::encode;
use rmpv::Value;

/// The most items reserved up front for one array or map; larger ones grow.
const MAX_RESERVE: usize = 1024;

/// Reads exactly one MessagePack value from `bytes`.
pub fn read(bytes: &[u8]) -> Result<Value, WireError> {
    let mut pos = 0;
    let value = value(bytes, &mut pos, 0)?;
    if pos < bytes.len() {
        return Err(WireError::TrailingBytes(bytes.len() - pos));
    }
    Ok(value)
}

/// The value at `pos`, which sits in `depth` containers; `pos` moves past it.
fn value(bytes: &[u8], pos: &mut usize, depth: usize) -> Result<Value, WireError> {
    let at = *pos;
    let head = scan::head(bytes, at).map_err(|fault| match fault {
        Fault::Undefined => WireError::MsgPack(format!(
            "byte {at} is 0xc1, a marker MessagePack never uses"
        )),
        Fault::Truncated => truncated(at),
    })?;
    *pos = head.next;
    Ok(match head.kind {
        Kind::Nil => Value::Nil,
        Kind::Bool(b) => Value::Boolean(b),
        Kind::Uint(n) => Value::from(n),
        Kind::Int(n) => Value::from(n),
        Kind::F32(f) => Value::F32(f),
        Kind::F64(f) => Value::F64(f),
        Kind::Str(raw) => match std::str::from_utf8(raw) {
            Ok(s) => Value::from(s),
            Err(_) => invalid_utf8_string(raw),
        },
        Kind::Bin(raw) => Value::Binary(raw.to_vec()),
        Kind::Ext(tag, raw) => Value::Ext(tag, raw.to_vec()),
        Kind::Array(n) => {
            let mut items = Vec::with_capacity(room(bytes, *pos, n, 1, depth, at)?);
            for _ in 0..n {
                items.push(value(bytes, pos, depth + 1)?);
            }
            Value::Array(items)
        }
        Kind::Map(n) => {
            let mut entries = Vec::with_capacity(room(bytes, *pos, n, 2, depth, at)?);
            for _ in 0..n {
                let key = value(bytes, pos, depth + 1)?;
                entries.push((key, value(bytes, pos, depth + 1)?));
            }
            Value::Map(entries)
        }
    })
}

/// Room for a container of `n` items, each at least `min_bytes` long, that
/// sits in `depth` containers and starts at `at`, without trusting `n`
/// further than the bytes left after `pos` can back it.
fn room(
    bytes: &[u8],
    pos: usize,
    n: usize,
    min_bytes: usize,
    depth: usize,
    at: usize,
) -> Result<usize, WireError> {
    if !super::may_open(depth) {
        return Err(WireError::TooDeep);
    }
    if n > bytes.len().saturating_sub(pos) / min_bytes {
        return Err(truncated(at));
    }
    Ok(n.min(MAX_RESERVE))
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
