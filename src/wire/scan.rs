//! Zero-copy reading of MessagePack: values as byte spans of the input.
//!
//! [`head`] is the one statement of the format (markers, lengths, the
//! undefined marker `0xc1`, truncation) and [`super::may_open`] of the
//! nesting bound; every MessagePack reader of the crate goes through them: the tree
//! reader (`msgpack::read`), [`any_end`] for bodies in any encoding (counted
//! before a tree is built, or read only at their top level), and the
//! canonical walks below. The walks' hot arms restate a few of the rules
//! for speed; the tests hold them to [`head`].
//!
//! [`validate`] walks a body once and accepts it only when [`super::decode`]
//! would read it without error (same refusals: undefined marker `0xc1`,
//! lengths past the end, nesting deeper than [`MAX_DEPTH`], trailing bytes)
//! AND every value is already in the shortest encoding that
//! [`super::msgpack::write`] would produce. For such a body, copying a value's
//! bytes is exactly what decoding it and encoding it again would give, so
//! outputs can be spliced from spans of the input. Bodies that fail either
//! test are simply not accepted here; the caller reads them as value trees.
//!
//! The accessors ([`str_bytes`], [`uint`], [`entries`], [`items`]) work on
//! spans of a validated body; on anything else they may return `None`, never
//! panic.

use super::MAX_DEPTH;

/// Whether `bytes` is exactly one valid, canonically encoded value.
pub fn validate(bytes: &[u8]) -> bool {
    skip(bytes, 0, 0) == Some(bytes.len())
}

/// The end of the value starting at `pos`, which sits in `depth` containers.
/// `None` when it is invalid or not in its shortest encoding.
///
/// One flat loop over the values still owed: a container adds its items to
/// the count instead of being walked by a call of its own. Nesting is not
/// tracked, only bounded: while the value has opened fewer containers than
/// the depth it may still nest, none of them can sit too deep. A value with
/// more containers than that is walked again by [`skip_nested`], which knows
/// each one's depth. Flat rather than recursive: a call per container costs
/// more per value (`docs/performance.md`).
fn skip(b: &[u8], pos: usize, depth: usize) -> Option<usize> {
    let budget = MAX_DEPTH.saturating_sub(depth);
    let mut opened = 0;
    let mut left: usize = 1;
    let mut p = pos;
    while left > 0 {
        left -= 1;
        let marker = *b.get(p)?;
        // One jump on the marker's class, not a chain of range tests
        // before reaching its arm.
        let (first, values) = match CLASS[usize::from(marker)] {
            Class::One => {
                p += 1;
                // A run of small non-negative integers (an array of token
                // IDs under 128), up to 8 values a word rather than a value
                // a turn: a prompt holds thousands. The run's last word
                // counts the integers before the first byte that is not one,
                // so the tail of a run is not walked a value a turn either.
                while left > 0 {
                    let Some(w) = word_at(b, p) else {
                        break;
                    };
                    let high = w & 0x8080_8080_8080_8080;
                    let n = ((high.trailing_zeros() / 8) as usize).min(left);
                    p += n;
                    left -= n;
                    if n < 8 {
                        break;
                    }
                }
                continue;
            }
            Class::FixStr => {
                p = body(b, p + 1, usize::from(marker & 0x1f))?;
                continue;
            }
            Class::U8 => {
                p = int(b, p + 1, 0xcc)?;
                continue;
            }
            Class::U16 => {
                p = uint_run(b, int(b, p + 1, 0xcd)?, &mut left);
                continue;
            }
            Class::U32 => {
                p = uint_run(b, int(b, p + 1, 0xce)?, &mut left);
                continue;
            }
            Class::F64 => {
                p = body(b, p + 1, 8)?;
                continue;
            }
            Class::Str8 => {
                p = str8(b, p + 1)?;
                continue;
            }
            Class::FixMap => (p + 1, usize::from(marker & 0x0f) * 2),
            Class::FixArray => (p + 1, usize::from(marker & 0x0f)),
            Class::Array16 => (p + 3, array16(b, p + 1)?),
            Class::Bin8 | Class::Bin16 | Class::Other => {
                let head = canonical(b, p)?;
                let Some(values) = head.values() else {
                    p = head.next;
                    continue;
                };
                (head.next, values)
            }
        };
        // A container: its values are owed too.
        if opened >= budget {
            return skip_nested(b, pos, depth);
        }
        opened += 1;
        left = left.checked_add(values)?;
        p = first;
    }
    Some(p)
}

/// The 8 bytes at `p` as a little-endian word, for the runs of small
/// integers; bytes past the end read as `0x80` (a byte that ends a run).
/// Near the end it is the body's last word shifted down: a run that ends
/// the body (a prompt's token IDs, the request's last key) was walked a
/// value a turn for its last 7 bytes. `None` for a body under 8 bytes.
#[inline(always)]
fn word_at(b: &[u8], p: usize) -> Option<u64> {
    let rest = b.get(p..)?;
    if let Some(w) = rest.first_chunk::<8>() {
        return Some(u64::from_le_bytes(*w));
    }
    // Fewer than 8 bytes from `p`: they are the last `rest.len()` of the
    // body's last word.
    let last = u64::from_le_bytes(*b.last_chunk::<8>()?);
    let gone = 8 * (8 - rest.len()) as u32;
    let past_end = 0x8080_8080_8080_8080u64 << (64 - gone);
    Some(last.checked_shr(gone).unwrap_or(0) | past_end)
}

/// The end of a run of two- and four-byte unsigned integers from `p`
/// (token IDs from 256 up: most of a prompt's), of at most `left` values,
/// each counted off `left`. It stops at anything else, a form that is not
/// the shortest, or fewer than 8 bytes left, where [`skip`] takes the value
/// as any other. This loop is cheaper per value than a turn through
/// `skip`'s class table, which matters for long prompts. Two variants are
/// slower: the bound computed once before the loop, and the width chosen
/// without branches.
#[inline(always)]
fn uint_run(b: &[u8], mut p: usize, left: &mut usize) -> usize {
    // The count in a register, not behind the reference, and each value
    // read as the first bytes of one word.
    let mut n = *left;
    while n > 0 {
        let Some(word) = b.get(p..).and_then(<[u8]>::first_chunk::<8>) else {
            break;
        };
        let w = u64::from_le_bytes(*word);
        // [`int`]'s shortest-form test for these two widths, restated on
        // the word (calling it costs its match on the marker per value);
        // `runs_of_wider_integers_are_walked_like_any_other_values` holds
        // the two to the same answers.
        p += match w as u8 {
            0xcd if w & 0xff00 != 0 => 3,
            0xce if w & 0xff_ff00 != 0 => 5,
            _ => break,
        };
        n -= 1;
    }
    *left = n;
    p
}

/// A marker's class, for [`skip`]'s one jump: the common ones get an arm
/// of their own, the rest go through [`canonical`].
#[derive(Clone, Copy)]
enum Class {
    One,
    FixStr,
    FixMap,
    FixArray,
    U8,
    U16,
    U32,
    /// A float64 (sampling options).
    F64,
    /// A string of 32 to 255 bytes (a model name, a request ID).
    Str8,
    /// Binary data of up to 255 bytes, and of up to 65,535 (an opaque
    /// state): answered by [`value_end`] without [`canonical`].
    Bin8,
    Bin16,
    /// An array of 16 to 65,535 items (a prompt's token IDs).
    Array16,
    Other,
}

static CLASS: [Class; 256] = {
    let mut class = [Class::Other; 256];
    let mut m = 0;
    while m < 256 {
        class[m] = match m as u8 {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => Class::One,
            0x80..=0x8f => Class::FixMap,
            0x90..=0x9f => Class::FixArray,
            0xa0..=0xbf => Class::FixStr,
            0xcc => Class::U8,
            0xcd => Class::U16,
            0xce => Class::U32,
            0xcb => Class::F64,
            0xd9 => Class::Str8,
            0xc4 => Class::Bin8,
            0xc5 => Class::Bin16,
            0xdc => Class::Array16,
            _ => Class::Other,
        };
        m += 1;
    }
    class
};

/// One value's header, read in any valid encoding: what the value is and
/// where what follows its header starts (the next value, or a container's
/// first).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Head<'a> {
    pub kind: Kind<'a>,
    pub next: usize,
}

/// What a value is. Integers as they were written: an unsigned marker reads
/// as `Uint`, a signed one as `Int` (rmpv makes the same integer of both).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind<'a> {
    Nil,
    Bool(bool),
    Uint(u64),
    Int(i64),
    F32(f32),
    F64(f64),
    /// A string's bytes (not necessarily UTF-8).
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Ext(i8, &'a [u8]),
    /// An array of this many items, which follow the header.
    Array(usize),
    /// A map of this many entries, keys and values alternating after the
    /// header.
    Map(usize),
}

/// Why no value can be read at a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `0xc1`, the one marker MessagePack never uses. rmpv reads it as nil,
    /// which would turn a corrupt byte into a missing field.
    Undefined,
    /// The value's header or data runs past the end.
    Truncated,
}

impl Head<'_> {
    /// How many values follow the header inside the value (keys counted);
    /// `None` for a scalar.
    #[inline(always)]
    fn values(&self) -> Option<usize> {
        match self.kind {
            Kind::Array(n) => Some(n),
            Kind::Map(n) => Some(n.saturating_mul(2)),
            _ => None,
        }
    }
}

/// The header of the value at `pos`: the one statement of MessagePack's
/// markers and lengths, for every reader of the crate (the tree reader, the
/// counting and top-level walks, and through [`canonical`] the in-place
/// walks).
#[inline(always)]
pub fn head(b: &[u8], pos: usize) -> Result<Head<'_>, Fault> {
    use Fault::Truncated;
    let marker = *b.get(pos).ok_or(Truncated)?;
    let p = pos + 1;
    let len =
        |at: usize, width: usize| usize::try_from(number(b, at, width)?).map_err(|_| Truncated);
    let data = |at: usize, n: usize| {
        let end = at.checked_add(n).ok_or(Truncated)?;
        b.get(at..end).ok_or(Truncated)
    };
    let (kind, next) = match marker {
        0x00..=0x7f => (Kind::Uint(u64::from(marker)), p),
        0xe0..=0xff => (Kind::Int(i64::from(marker as i8)), p),
        0x80..=0x8f => (Kind::Map(usize::from(marker & 0x0f)), p),
        0x90..=0x9f => (Kind::Array(usize::from(marker & 0x0f)), p),
        0xa0..=0xbf => {
            let s = data(p, usize::from(marker & 0x1f))?;
            (Kind::Str(s), p + s.len())
        }
        0xc0 => (Kind::Nil, p),
        0xc1 => return Err(Fault::Undefined),
        0xc2 | 0xc3 => (Kind::Bool(marker == 0xc3), p),
        0xc4..=0xc6 => {
            let width = 1 << (marker - 0xc4);
            let s = data(p + width, len(p, width)?)?;
            (Kind::Bin(s), p + width + s.len())
        }
        0xc7..=0xc9 => {
            let width = 1 << (marker - 0xc7);
            let n = len(p, width)?;
            let tag = *b.get(p + width).ok_or(Truncated)? as i8;
            let s = data(p + width + 1, n)?;
            (Kind::Ext(tag, s), p + width + 1 + n)
        }
        0xca => (Kind::F32(f32::from_bits(number(b, p, 4)? as u32)), p + 4),
        0xcb => (Kind::F64(f64::from_bits(number(b, p, 8)?)), p + 8),
        0xcc..=0xcf => {
            let width = 1 << (marker - 0xcc);
            (Kind::Uint(number(b, p, width)?), p + width)
        }
        0xd0..=0xd3 => {
            let width = 1 << (marker - 0xd0);
            // Sign-extended from the top bit of its width.
            let shift = 64 - 8 * width as u32;
            let n = ((number(b, p, width)? << shift) as i64) >> shift;
            (Kind::Int(n), p + width)
        }
        0xd4..=0xd8 => {
            let tag = *b.get(p).ok_or(Truncated)? as i8;
            let s = data(p + 1, 1 << (marker - 0xd4))?;
            (Kind::Ext(tag, s), p + 1 + s.len())
        }
        0xd9..=0xdb => {
            let width = 1 << (marker - 0xd9);
            let s = data(p + width, len(p, width)?)?;
            (Kind::Str(s), p + width + s.len())
        }
        0xdc..=0xdf => {
            let width = 2 << (marker & 1);
            let n = len(p, width)?;
            let kind = if marker >= 0xde {
                Kind::Map(n)
            } else {
                Kind::Array(n)
            };
            (kind, p + width)
        }
    };
    Ok(Head { kind, next })
}

/// The number in the `width` (1, 2, 4 or 8) bytes at `at`: one arm per
/// width, as [`int`] reads them (a loop over a width known only at run time
/// costs twice as much).
#[inline(always)]
fn number(b: &[u8], at: usize, width: usize) -> Result<u64, Fault> {
    match width {
        1 => be_at::<1>(b, at),
        2 => be_at::<2>(b, at),
        4 => be_at::<4>(b, at),
        _ => be_at::<8>(b, at),
    }
    .ok_or(Fault::Truncated)
}

/// The marker of a value's shortest encoding, the one
/// [`super::msgpack::write`] gives it: a fix form when one holds the value,
/// else the narrowest width; a non-negative integer as unsigned.
fn shortest(kind: &Kind<'_>) -> u8 {
    // The marker for a length or number `n` whose 8-bit form is `w8`, with
    // the 16- and 32-bit forms after it.
    let sized = |n: u64, w8: u8| match n {
        0..0x100 => w8,
        0x100..0x1_0000 => w8 + 1,
        _ => w8 + 2,
    };
    let container = |n: usize, fix: u8, w16: u8| match n {
        0..16 => fix | n as u8,
        16..0x1_0000 => w16,
        _ => w16 + 1,
    };
    match *kind {
        Kind::Nil => 0xc0,
        Kind::Bool(b) => 0xc2 | u8::from(b),
        Kind::Int(n @ 0..) => shortest(&Kind::Uint(n as u64)),
        Kind::Uint(n @ 0..0x80) => n as u8,
        Kind::Uint(n) if n > u64::from(u32::MAX) => 0xcf,
        Kind::Uint(n) => sized(n, 0xcc),
        Kind::Int(n @ -32..) => n as u8,
        Kind::Int(n) => match n {
            -0x80.. => 0xd0,
            -0x8000.. => 0xd1,
            -0x8000_0000.. => 0xd2,
            _ => 0xd3,
        },
        Kind::F32(_) => 0xca,
        Kind::F64(_) => 0xcb,
        Kind::Str(s) if s.len() < 32 => 0xa0 | s.len() as u8,
        Kind::Str(s) => sized(s.len() as u64, 0xd9),
        Kind::Bin(s) => sized(s.len() as u64, 0xc4),
        Kind::Ext(_, d) => match d.len() {
            1 => 0xd4,
            2 => 0xd5,
            4 => 0xd6,
            8 => 0xd7,
            16 => 0xd8,
            n => sized(n as u64, 0xc7),
        },
        Kind::Array(n) => container(n, 0x90, 0xdc),
        Kind::Map(n) => container(n, 0x80, 0xde),
    }
}

/// The value at `pos` when it is in its shortest encoding: [`head`] and
/// the rule [`validate`] adds to it.
#[inline(always)]
fn canonical(b: &[u8], pos: usize) -> Option<Head<'_>> {
    let head = head(b, pos).ok()?;
    (b.get(pos) == Some(&shortest(&head.kind))).then_some(head)
}

/// [`skip`] for a value with many containers: each walked by a call of its
/// own, which knows its depth.
fn skip_nested(b: &[u8], pos: usize, depth: usize) -> Option<usize> {
    let head = canonical(b, pos)?;
    let Some(values) = head.values() else {
        return Some(head.next);
    };
    super::may_open(depth).then_some(())?;
    let mut p = head.next;
    for _ in 0..values {
        p = skip_nested(b, p, depth + 1)?;
    }
    Some(p)
}

/// Why [`any_end`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// More values than the budget.
    Over,
    /// An undefined marker, a length past the end, or nesting past
    /// [`MAX_DEPTH`].
    Invalid,
}

/// The end of the value at `pos` in any valid encoding, canonical or not,
/// which sits in `depth` containers. Every value (scalar, container, key,
/// item) is counted off `budget`, and the walk stops at the first one past
/// it. For bodies the in-place path does not take: counting their values
/// before a tree is built, finding their top-level entries.
pub fn any_end(b: &[u8], pos: usize, depth: usize, budget: &mut usize) -> Result<usize, Stop> {
    *budget = budget.checked_sub(1).ok_or(Stop::Over)?;
    let head = head(b, pos).map_err(|_| Stop::Invalid)?;
    let Some(values) = head.values() else {
        return Ok(head.next);
    };
    if !super::may_open(depth) {
        return Err(Stop::Invalid);
    }
    let mut p = head.next;
    for _ in 0..values {
        // One-byte values (all of a hostile array of `nil`) without a call:
        // this loop is most of what refusing such a body costs.
        match b.get(p).map(|m| CLASS[usize::from(*m)]) {
            Some(Class::One) => {
                *budget = budget.checked_sub(1).ok_or(Stop::Over)?;
                p += 1;
            }
            _ => p = any_end(b, p, depth + 1, budget)?,
        }
    }
    Ok(p)
}

/// The end of an unsigned integer whose marker (0xcc to 0xce) is just
/// before `p`, when it is in its shortest form: [`shortest`]'s rule, a
/// number too large for the next narrower form.
#[inline(always)]
fn int(b: &[u8], p: usize, marker: u8) -> Option<usize> {
    // One arm per width (token IDs are mostly 0xcd and 0xce), not a width
    // computed at run time and a loop over the upper half (`docs/performance.md`).
    let (width, canonical) = match marker {
        0xcc => (1, *b.get(p)? >= 0x80),
        0xcd => (2, be_at::<2>(b, p)? >> 8 != 0),
        _ => (4, be_at::<4>(b, p)? >> 16 != 0),
    };
    canonical.then_some(p + width)
}

/// The end of a str8 whose marker is just before `p`, when it is the
/// shortest form (32 bytes or more): [`canonical`]'s rule for `0xd9`, without
/// its match.
#[inline(always)]
fn str8(b: &[u8], p: usize) -> Option<usize> {
    let n = usize::from(*b.get(p)?);
    (n >= 32).then_some(())?;
    body(b, p + 1, n)
}

/// The item count of an array16 whose marker is just before `p`, when it
/// is the shortest form (16 items or more): [`canonical`]'s rule for `0xdc`.
#[inline(always)]
fn array16(b: &[u8], p: usize) -> Option<usize> {
    let n = be_at::<2>(b, p)? as usize;
    (n >= 16).then_some(n)
}

/// The big-endian unsigned number in the `N` bytes at `p`.
#[inline(always)]
fn be_at<const N: usize>(b: &[u8], p: usize) -> Option<u64> {
    let raw = b.get(p..)?.first_chunk::<N>()?;
    Some(raw.iter().fold(0u64, |n, x| (n << 8) | u64::from(*x)))
}

fn body(b: &[u8], p: usize, n: usize) -> Option<usize> {
    let end = p.checked_add(n)?;
    (end <= b.len()).then_some(end)
}

/// The end of the canonically encoded value starting at `pos`, which sits in
/// `depth` containers (so that nesting is bounded as [`validate`] bounds it);
/// `None` when it is invalid or not canonical. For readers that validate a
/// body piece by piece, reading some pieces themselves.
///
/// Keys and most scalars are answered here, without a call to the walker.
#[inline]
pub fn value_end(bytes: &[u8], pos: usize, depth: usize) -> Option<usize> {
    let marker = *bytes.get(pos)?;
    match CLASS[usize::from(marker)] {
        Class::One => Some(pos + 1),
        Class::FixStr => body(bytes, pos + 1, usize::from(marker & 0x1f)),
        Class::FixMap | Class::FixArray | Class::Array16 => skip(bytes, pos, depth),
        // The scalars a result's top level, frame and params hold besides
        // fixstrs (a request ID, a context request ID, an opaque state),
        // each by its own rule, without going through `other_end`'s
        // match.
        Class::U8 => int(bytes, pos + 1, 0xcc),
        Class::U16 => int(bytes, pos + 1, 0xcd),
        Class::U32 => int(bytes, pos + 1, 0xce),
        Class::F64 => body(bytes, pos + 1, 8),
        Class::Str8 => str8(bytes, pos + 1),
        // bin8: any length is the shortest form.
        Class::Bin8 => body(bytes, pos + 2, usize::from(*bytes.get(pos + 1)?)),
        Class::Bin16 => {
            let n = be_at::<2>(bytes, pos + 1)? as usize;
            (n > 0xff).then_some(())?;
            body(bytes, pos + 3, n)
        }
        Class::Other => other_end(bytes, pos, depth),
    }
}

/// [`value_end`] for the other markers: a scalar (a sized integer, a longer
/// string, binary data) read by [`canonical`] alone, without [`skip`]'s loop,
/// whose set-up would cost more than the scalar itself.
#[inline(never)]
fn other_end(bytes: &[u8], pos: usize, depth: usize) -> Option<usize> {
    let head = canonical(bytes, pos)?;
    match head.values() {
        None => Some(head.next),
        Some(_) => skip(bytes, pos, depth),
    }
}

/// A canonical map header at the start of `raw`: the entry count and the
/// offset of the first key.
pub fn map_header(raw: &[u8]) -> Option<(usize, usize)> {
    container_header(raw, 0x80, 0xde)
}

/// A canonical array header at the start of `raw`: the item count and the
/// offset of the first item.
pub fn array_header(raw: &[u8]) -> Option<(usize, usize)> {
    container_header(raw, 0x90, 0xdc)
}

/// A canonical container header: the entry or item count and where the
/// first one starts.
fn container_header(raw: &[u8], fix: u8, wide: u8) -> Option<(usize, usize)> {
    let marker = *raw.first()?;
    if marker & 0xf0 == fix {
        Some((usize::from(marker & 0x0f), 1))
    } else if marker == wide {
        let n = be_at::<2>(raw, 1)? as usize;
        (n >= 16).then_some((n, 3))
    } else if marker == wide + 1 {
        let n = be_at::<4>(raw, 1)? as usize;
        (n > 0xffff).then_some((n, 5))
    } else {
        None
    }
}

/// Whether the span is `nil`.
pub fn is_nil(raw: &[u8]) -> bool {
    raw == [0xc0]
}

/// The bytes of a string value (not necessarily UTF-8).
pub fn str_bytes(raw: &[u8]) -> Option<&[u8]> {
    let marker = *raw.first()?;
    let start = match marker {
        0xa0..=0xbf => 1,
        0xd9 => 2,
        0xda => 3,
        0xdb => 5,
        _ => return None,
    };
    raw.get(start..)
}

/// A non-negative integer value (as `rmpv::Value::as_u64` reads it).
pub fn uint(raw: &[u8]) -> Option<u64> {
    let marker = *raw.first()?;
    match marker {
        0x00..=0x7f => Some(u64::from(marker)),
        0xcc..=0xcf => {
            let width = 1 << (marker - 0xcc);
            let bytes = raw.get(1..1 + width)?;
            Some(bytes.iter().fold(0u64, |n, x| (n << 8) | u64::from(*x)))
        }
        _ => None,
    }
}

/// The span of each value inside a container span, in order.
pub struct Spans<'a> {
    bytes: &'a [u8],
    pos: usize,
    left: usize,
}

impl<'a> Iterator for Spans<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        // A validated body sits in at most MAX_DEPTH containers from here.
        let end = skip(self.bytes, self.pos, 0)?;
        let out = self.bytes.get(self.pos..end)?;
        self.pos = end;
        self.left -= 1;
        Some(out)
    }
}

/// The number of items and their spans, if the span is an array.
pub fn items(raw: &[u8]) -> Option<(usize, Spans<'_>)> {
    container_spans(raw, 0x90, 0xdc, 1)
}

/// The number of entries and the spans of keys and values (alternating), if
/// the span is a map.
pub fn entries(raw: &[u8]) -> Option<(usize, Spans<'_>)> {
    container_spans(raw, 0x80, 0xde, 2)
}

fn container_spans(raw: &[u8], fix: u8, wide: u8, per: usize) -> Option<(usize, Spans<'_>)> {
    let (n, start) = container_header(raw, fix, wide)?;
    let spans = Spans {
        bytes: raw,
        pos: start,
        left: n.checked_mul(per)?,
    };
    Some((n, spans))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::wire::{Encoding, decode, encode};
    use proptest::prelude::*;
    use rmpv::Value;

    #[test]
    fn canonical_encodings_validate_and_others_do_not() {
        let cases: &[(&[u8], bool)] = &[
            (&[0x05], true),
            (&[0xcc, 0x05], false),
            (&[0xcc, 0x80], true),
            (&[0xcd, 0x00, 0xff], false),
            (&[0xcd, 0x01, 0x00], true),
            (&[0xd0, 0x05], false),
            (&[0xd0, 0xe0], false),
            (&[0xd0, 0xdf], true),
            (&[0xd1, 0xff, 0x80], false),
            (&[0xd1, 0xff, 0x7f], true),
            (&[0xd9, 0x01, b'a'], false),
            (&[0xa1, b'a'], true),
            (&[0xc7, 0x01, 0x01, 0x00], false),
            (&[0xd4, 0x01, 0x00], true),
            (&[0xdc, 0x00, 0x01, 0x01], false),
            (&[0x91, 0x01], true),
            (&[0xc1], false),
            (&[0x91], false),
            (&[0x01, 0x02], false),
            (&[0xc4, 0x00], true),
        ];
        // Strings and binary data just either side of a narrower form.
        let sized = |head: &[u8], n: usize| [head, &vec![b'x'; n][..]].concat();
        let longer = [
            (sized(&[0xd9, 32], 32), true),
            (sized(&[0xd9, 31], 31), false),
            (sized(&[0xd9, 33], 32), false),
            (sized(&[0xc4, 255], 255), true),
            (sized(&[0xc5, 1, 0], 256), true),
            (sized(&[0xc5, 0, 255], 255), false),
            (sized(&[0xc5, 1, 0], 255), false),
        ];
        let all = cases.iter().map(|(b, ok)| (*b, *ok));
        for (bytes, ok) in all.chain(longer.iter().map(|(b, ok)| (&b[..], *ok))) {
            assert_eq!(validate(bytes), ok, "{bytes:x?}");
            // The piecewise reader agrees.
            assert_eq!(
                value_end(bytes, 0, 0) == Some(bytes.len()),
                ok,
                "{bytes:x?}"
            );
        }
    }

    #[test]
    fn an_integer_validates_in_its_shortest_form_only() {
        let edges: [i128; 16] = [
            0,
            1,
            127,
            128,
            255,
            256,
            65535,
            65536,
            1 << 32,
            -1,
            -32,
            -33,
            -128,
            -129,
            -32768,
            -32769,
        ];
        let more = [
            i128::from(i32::MIN),
            i128::from(i32::MIN) - 1,
            i128::from(i64::MIN),
        ];
        for n in edges.into_iter().chain(more).chain([i128::from(u64::MAX)]) {
            let value = match u64::try_from(n) {
                Ok(u) => Value::from(u),
                Err(_) => Value::from(n as i64),
            };
            let canonical = encode(&value, Encoding::MsgPack);
            let forms: [(u8, usize); 8] = [
                (0xcc, 1),
                (0xcd, 2),
                (0xce, 4),
                (0xcf, 8),
                (0xd0, 1),
                (0xd1, 2),
                (0xd2, 4),
                (0xd3, 8),
            ];
            for (marker, width) in forms {
                let fits = if marker < 0xd0 {
                    n >= 0 && n < 1i128 << (8 * width)
                } else {
                    n >= -(1i128 << (8 * width - 1)) && n < 1i128 << (8 * width - 1)
                };
                if !fits {
                    continue;
                }
                let mut bytes = vec![marker];
                bytes.extend_from_slice(&(n as u64).to_be_bytes()[8 - width..]);
                assert_eq!(validate(&bytes), bytes == canonical, "{n} as {marker:#x}");
            }
        }
    }

    #[test]
    fn more_containers_than_the_depth_bound_are_walked_by_depth() {
        // 100 sibling arrays, each around one integer: more containers than
        // MAX_DEPTH, none deep.
        let mut siblings = vec![0xdc, 0, 100];
        for _ in 0..100 {
            siblings.extend_from_slice(&[0x91, 0x01]);
        }
        assert!(decode(&siblings, Encoding::MsgPack).is_ok());
        assert!(validate(&siblings));
        // The same after many siblings, then one nesting exactly to the
        // bound or one past it.
        for levels in [MAX_DEPTH - 1, MAX_DEPTH] {
            let mut bytes = vec![0x92, 0xdc, 0, 80];
            bytes.extend(std::iter::repeat_n(0x90, 80));
            bytes.extend(std::iter::repeat_n(0x91, levels));
            bytes.push(0x01);
            let readable = decode(&bytes, Encoding::MsgPack).is_ok();
            assert_eq!(readable, levels < MAX_DEPTH, "{levels} levels");
            assert_eq!(validate(&bytes), readable, "{levels} levels");
        }
        // A value found past the bound by a reader that starts deep.
        assert_eq!(skip(&[0x91, 0x01], 0, MAX_DEPTH), None);
        assert_eq!(skip(&[0x91, 0x01], 0, MAX_DEPTH - 1), Some(2));
        assert_eq!(skip(&[0x01], 0, MAX_DEPTH + 3), Some(1));
    }

    #[test]
    fn every_markers_class_is_what_head_makes_of_it() {
        for m in 0..=255u8 {
            let mut bytes = [0x01; 40];
            bytes[0] = m;
            let read = head(&bytes, 0);
            let is_scalar_of =
                |width: usize| matches!(read, Ok(h) if h.values().is_none() && h.next == 1 + width);
            let ok = match CLASS[usize::from(m)] {
                Class::One => is_scalar_of(0),
                Class::FixStr => is_scalar_of(usize::from(m & 0x1f)),
                Class::FixMap | Class::FixArray => matches!(read, Ok(h) if h.values().is_some()),
                Class::U8 | Class::U16 | Class::U32 => (0xcc..=0xce).contains(&m),
                Class::F64 => m == 0xcb && is_scalar_of(8),
                Class::Str8 => m == 0xd9,
                Class::Bin8 => m == 0xc4,
                Class::Bin16 => m == 0xc5,
                Class::Array16 => m == 0xdc,
                Class::Other => !matches!(
                    m,
                    0x00..=0x9f | 0xa0..=0xbf | 0xcb..=0xce | 0xd9 | 0xc4 | 0xc5 | 0xdc
                ),
            };
            assert!(ok, "marker {m:#x}");
        }
    }

    #[test]
    fn every_markers_arm_answers_as_canonical_does() {
        // Each marker before lengths and numbers either side of the
        // shortest-form bounds (31 and 32 bytes, 15 and 16 items, 0xff and
        // 0x100), then one-byte values, cut at every length, at depths
        // where a container may and may not open: the walk's arms end or
        // refuse a value as the walk through `canonical` alone does.
        let edges = [0x00, 0x01, 0x0f, 0x10, 0x1f, 0x20, 0xff];
        for marker in 0..=255u8 {
            for (x, y) in edges
                .iter()
                .flat_map(|x| edges.iter().map(move |y| (*x, *y)))
            {
                let mut bytes = vec![marker, x, y];
                bytes.extend([0x01; 40]);
                for end in 0..=bytes.len() {
                    let cut = &bytes[..end];
                    for depth in [0, MAX_DEPTH - 1, MAX_DEPTH] {
                        let nested = skip_nested(cut, 0, depth);
                        assert_eq!(skip(cut, 0, depth), nested, "{cut:x?} at {depth}");
                    }
                }
            }
        }
    }

    #[test]
    fn depth_is_bounded_as_the_reader_bounds_it() {
        for levels in [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1] {
            let mut nested = vec![0x91; levels];
            nested.push(0x01);
            let readable = decode(&nested, Encoding::MsgPack).is_ok();
            assert_eq!(readable, levels <= MAX_DEPTH);
            assert_eq!(validate(&nested), readable, "{levels} levels");
        }
    }

    /// Where the reference reader ([`decode`]) ends the value at the
    /// start of `bytes`, read inside one container as `any_end` reads
    /// it: the one prefix it reads whole (a valid value has one length).
    fn reference_end(bytes: &[u8]) -> Option<usize> {
        (1..=bytes.len()).find(|&end| {
            let mut inside = vec![0x91];
            inside.extend_from_slice(&bytes[..end]);
            decode(&inside, Encoding::MsgPack).is_ok()
        })
    }

    /// Any value tree, scalars of every kind and width, strings and binary
    /// data either side of the 8-bit lengths.
    pub(in crate::wire) fn any_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Nil),
            any::<bool>().prop_map(Value::Boolean),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f32>().prop_map(Value::F32),
            any::<f64>().prop_map(Value::F64),
            (0usize..300).prop_map(|n| Value::from("x".repeat(n))),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(Value::Binary),
            (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..20))
                .prop_map(|(tag, data)| Value::Ext(tag, data)),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
            ]
        })
    }

    /// Bytes that are mostly MessagePack markers and small lengths (so that
    /// headers are often satisfiable), or a valid encoding cut short or
    /// with one byte changed.
    fn bodies() -> impl Strategy<Value = Vec<u8>> {
        let markers: Vec<u8> = [
            0x00, 0x05, 0x7f, 0x80, 0x81, 0x82, 0x8f, 0x90, 0x91, 0x92, 0x9f,
        ]
        .into_iter()
        .chain([0xa0, 0xa1, 0xa3, 0xbf, 0xe0, 0xff])
        .chain(0xc0..=0xdf)
        .collect();
        let byte = prop_oneof![
            3 => proptest::sample::select(markers),
            2 => 0u8..4,
            1 => any::<u8>(),
        ];
        // Token IDs as a prompt carries them: runs of small integers and of
        // two- and four-byte ones (the runs `skip` walks a word at a time),
        // in their shortest forms or not, with other values among them,
        // under a header that may miscount them, cut or followed by more.
        let other: Vec<&[u8]> = vec![
            &[0xcd, 0x01, 0x00],
            &[0xcd, 0x00, 0xff],
            &[0xce, 0x00, 0x01, 0x00, 0x00],
            &[0xce, 0x00, 0x00, 0xff, 0xff],
            &[0xc0],
            &[0xff],
            &[0x80],
            &[0xcc, 0x80],
            &[0xcc, 0x05],
        ];
        let token = prop_oneof![
            3 => (0u8..0x80).prop_map(|b| vec![b]),
            2 => proptest::sample::select(other).prop_map(<[u8]>::to_vec),
        ];
        let tokens = (
            proptest::collection::vec(token, 0..40),
            0usize..3,
            proptest::option::of(any::<prop::sample::Index>()),
            any::<bool>(),
        );
        prop_oneof![
            proptest::collection::vec(byte, 0..48),
            tokens.prop_map(|(tokens, claim, cut, followed)| {
                let n = (tokens.len() + claim).saturating_sub(1);
                let mut bytes = match n {
                    0..16 => vec![0x90 | n as u8],
                    _ => vec![0xdc, 0, n as u8],
                };
                bytes.extend(tokens.concat());
                if followed {
                    bytes.extend([0x01; 9]);
                }
                if let Some(cut) = cut {
                    bytes.truncate(cut.index(bytes.len() + 1));
                }
                bytes
            }),
            (
                any_value(),
                any::<prop::sample::Index>(),
                any::<u8>(),
                0u8..3
            )
                .prop_map(|(v, at, with, how)| {
                    let mut bytes = encode(&v, Encoding::MsgPack);
                    if !bytes.is_empty() {
                        let at = at.index(bytes.len());
                        match how {
                            0 => bytes.truncate(at),
                            1 => bytes[at] = with,
                            _ => {}
                        }
                    }
                    bytes
                },),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// A body validates exactly when writing what the reader reads of
        /// it gives it back, and the flat walk, the piecewise reader and
        /// the nested walk end a value at the same place, at depths around
        /// the bound.
        #[test]
        fn a_body_is_canonical_exactly_when_the_writer_gives_it_back(
            body in bodies(),
            depth in proptest::sample::select(vec![0, 1, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH]),
        ) {
            let rewritten = decode(&body, Encoding::MsgPack).ok().map(|v| encode(&v, Encoding::MsgPack));
            prop_assert_eq!(validate(&body), rewritten.as_deref() == Some(&body[..]), "{:x?}", body);
            let nested = skip_nested(&body, 0, depth);
            prop_assert_eq!(skip(&body, 0, depth), nested, "{:x?} at depth {}", body, depth);
            prop_assert_eq!(value_end(&body, 0, depth), nested, "{:x?} at depth {}", body, depth);
        }
    }

    proptest! {
        /// [`any_end`], the walk that counts values and finds the
        /// top-level entries of bodies read in no other way, ends a value
        /// exactly where the reference reader does, and refuses what it
        /// refuses: undefined markers, lengths past the end, nesting past
        /// [`MAX_DEPTH`]; after other bytes and under containers up to the
        /// bound.
        #[test]
        fn any_end_ends_a_value_where_the_reader_does(
            before in proptest::collection::vec(any::<u8>(), 0..3),
            levels in proptest::sample::select(vec![0, 0, 1, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH]),
            body in bodies(),
        ) {
            let mut bytes = before.clone();
            bytes.extend(std::iter::repeat_n(0x91, levels));
            bytes.extend_from_slice(&body);
            let pos = before.len();
            prop_assert_eq!(
                any_end(&bytes, pos, 1, &mut { usize::MAX }).ok(),
                reference_end(&bytes[pos..]).map(|end| pos + end),
                "{:x?} from {}", bytes, pos
            );
        }
    }
}
