//! JSON for the worker: [`to_vec`] writes a value tree as JSON,
//! [`json_to_msgpack`] reads a JSON result into the MessagePack the
//! in-place decision reads (carrying the values it only copies as their
//! JSON text), and [`msgpack_to_json`] writes that decision's outputs back.
//! serde_json does all the reading and the writing of scalars; the walks
//! here only say where each value goes.
//!
//! [`to_vec`] writes exactly what JSON carries (null, booleans, integers,
//! finite floats, UTF-8 strings, arrays, maps with string keys) and refuses
//! anything else: an output that cannot be written is an error, never a
//! stand-in. [`to_json`] renders anything readably, for printing
//! (`explain`) and for the messages the worker builds itself.

use super::scan::{self, Kind};
use super::{NotJson, may_open, msgpack};
use rmpv::Value;
use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

/// The ext type of a value carried as its JSON text ([`json_to_msgpack`]).
/// A JSON result holds no ext values of its own.
const CARRIED: i8 = 74;

/// `value` as compact JSON, as serde_json writes it, or what in it JSON
/// cannot carry: the value's MessagePack written as [`msgpack_to_json`]
/// writes it, so value trees and the in-place path's outputs have one JSON
/// writer.
pub(super) fn to_vec(value: &Value) -> Result<Vec<u8>, NotJson> {
    let mut bytes = Vec::with_capacity(256);
    msgpack::write(&mut bytes, value);
    write_json(&bytes, bytes.len() + 64, false)
}

/// The outputs the in-place decision wrote for a JSON result, as JSON:
/// what [`to_vec`] writes for their value trees, carried values as their
/// text. Or why they cannot be.
pub fn msgpack_to_json(bytes: &[u8], capacity: usize) -> Result<Vec<u8>, NotJson> {
    write_json(bytes, capacity, true)
}

/// One MessagePack value as JSON. With `carried`, an ext value of type
/// [`CARRIED`] is JSON text, written as it is.
fn write_json(bytes: &[u8], capacity: usize, carried: bool) -> Result<Vec<u8>, NotJson> {
    let mut out = Vec::with_capacity(capacity);
    let end = write(&mut out, bytes, 0, carried)?;
    if end != bytes.len() {
        return Err(NotJson("trailing bytes after one value".into()));
    }
    Ok(out)
}

/// Appends the value at `pos` of `b` as JSON; returns where it ends.
fn write(out: &mut Vec<u8>, b: &[u8], pos: usize, carried: bool) -> Result<usize, NotJson> {
    let refuse = |what: &str| NotJson(format!("it holds {what}, which JSON cannot carry"));
    let string = |out: &mut Vec<u8>, bytes: &[u8]| {
        if bytes.iter().all(|&b| AS_IS[usize::from(b)]) {
            out.push(b'"');
            out.extend_from_slice(bytes);
            out.push(b'"');
            return Ok(());
        }
        match std::str::from_utf8(bytes) {
            Ok(text) => {
                scalar(out, text);
                Ok(())
            }
            Err(_) => Err(refuse("a string that is not UTF-8")),
        }
    };
    let read =
        |at: usize| scan::head(b, at).map_err(|e| NotJson(format!("not MessagePack ({e:?})")));
    let head = read(pos)?;
    let mut p = head.next;
    match head.kind {
        Kind::Nil => out.extend_from_slice(b"null"),
        Kind::Bool(b) => out.extend_from_slice(if b { b"true" } else { b"false" }),
        Kind::Uint(n) => scalar(out, &n),
        Kind::Int(n) => scalar(out, &n),
        Kind::F32(f) if f.is_finite() => scalar(out, &f),
        Kind::F64(f) if f.is_finite() => scalar(out, &f),
        Kind::F32(_) | Kind::F64(_) => return Err(refuse("a float that is not finite")),
        Kind::Str(bytes) => string(out, bytes)?,
        Kind::Bin(_) => return Err(refuse("a binary value")),
        Kind::Ext(CARRIED, text) if carried => out.extend_from_slice(text),
        Kind::Ext(tag, _) => return Err(refuse(&format!("an ext value of type {tag}"))),
        Kind::Array(n) => {
            out.push(b'[');
            for i in 0..n {
                if i > 0 {
                    out.push(b',');
                }
                p = write(out, b, p, carried)?;
            }
            out.push(b']');
        }
        Kind::Map(n) => {
            out.push(b'{');
            for i in 0..n {
                if i > 0 {
                    out.push(b',');
                }
                let key = read(p)?;
                let not_a_name = || refuse("a map key that is not a UTF-8 string");
                let Kind::Str(name) = key.kind else {
                    return Err(not_a_name());
                };
                string(out, name).map_err(|_| not_a_name())?;
                out.push(b':');
                p = write(out, b, key.next, carried)?;
            }
            out.push(b'}');
        }
    }
    Ok(p)
}

/// The bytes of a string serde_json writes as they are: printable ASCII
/// but the quote and the backslash. A string of only these needs no UTF-8
/// check either.
static AS_IS: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0x20;
    while b < 0x7f {
        table[b] = b != b'"' as usize && b != b'\\' as usize;
        b += 1;
    }
    table
};

/// A number or a string as serde_json writes it (its number formats and
/// string escapes).
fn scalar<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing a number or a string into a Vec cannot fail.
    let _ = serde_json::to_writer(out, value);
}

/// What the in-place decision does with the value under a key of an object
/// ([`json_to_msgpack`]'s plan).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// Read: converted to MessagePack.
    Read,
    /// Only copied: carried as its JSON text.
    Copied,
    /// An object read at the plan's level given (any other value converted).
    Object(u8),
    /// An array of objects read at the plan's level given.
    Objects(u8),
}

/// The plan of a read: what to do with the value under `key` in an object
/// at `level` (the top level is 0).
pub type Plan = fn(level: u8, key: &str) -> Field;

/// A JSON body as MessagePack, as decoding it into a value tree and
/// encoding that would write it, except that the values `plan` names
/// [`Field::Copied`] are carried as ext values of type [`CARRIED`] holding
/// their JSON text as the body has it. `None` when serde_json refuses the
/// body (as [`super::decode`] does), and when a carried value would not
/// pass the value-tree path's read ([`carry`]): the value-tree path decides
/// those.
pub fn json_to_msgpack(json: &[u8], plan: Plan) -> Option<Vec<u8>> {
    // One UTF-8 check of the whole body, not one per string and carried value.
    let json = std::str::from_utf8(json).ok()?;
    let mut out = Vec::with_capacity(json.len() + 64);
    let mut reader = serde_json::Deserializer::from_str(json);
    let top = Convert {
        out: &mut out,
        plan,
        mode: Mode::Object(0),
        depth: 0,
    };
    top.deserialize(&mut reader).ok()?;
    reader.end().ok()?;
    Some(out)
}

#[derive(Clone, Copy)]
enum Mode {
    Value,
    Object(u8),
    Objects(u8),
}

/// Writes one JSON value as MessagePack, reading objects as `mode` says.
struct Convert<'o> {
    out: &'o mut Vec<u8>,
    plan: Plan,
    mode: Mode,
    /// The containers around the value.
    depth: usize,
}

impl Convert<'_> {
    fn inner(&mut self, mode: Mode) -> Convert<'_> {
        Convert {
            out: self.out,
            plan: self.plan,
            mode,
            depth: self.depth + 1,
        }
    }

    /// Puts an array's or a map's header of `n` before its items, written
    /// from `start` on.
    fn header(out: &mut Vec<u8>, start: usize, n: usize, map: bool) {
        let mut head = [0; 5];
        let mut free = &mut head[..];
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        // Five bytes hold any header.
        let _ = if map {
            rmp::encode::write_map_len(&mut free, n)
        } else {
            rmp::encode::write_array_len(&mut free, n)
        };
        let written = 5 - free.len();
        out.extend_from_slice(&head[..written]);
        if let Some(items) = out.get_mut(start..) {
            items.rotate_right(written);
        }
    }
}

impl<'de> DeserializeSeed<'de> for Convert<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Convert<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.out.push(0xc0);
        Ok(())
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<(), E> {
        msgpack::write(self.out, &Value::Boolean(b));
        Ok(())
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<(), E> {
        msgpack::write_uint(self.out, n);
        Ok(())
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<(), E> {
        msgpack::write(self.out, &Value::from(n));
        Ok(())
    }

    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<(), E> {
        msgpack::write(self.out, &Value::F64(f));
        Ok(())
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<(), E> {
        msgpack::write_str(self.out, s.as_bytes());
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut items: A) -> Result<(), A::Error> {
        if !may_open(self.depth) {
            return Err(A::Error::custom("too deep"));
        }
        let item = match self.mode {
            Mode::Objects(level) => Mode::Object(level),
            _ => Mode::Value,
        };
        let start = self.out.len();
        let mut n = 0;
        while items.next_element_seed(self.inner(item))?.is_some() {
            n += 1;
        }
        Convert::header(self.out, start, n, false);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut entries: A) -> Result<(), A::Error> {
        if !may_open(self.depth) {
            return Err(A::Error::custom("too deep"));
        }
        let start = self.out.len();
        let mut n = 0;
        while let Some(key) = entries.next_key_seed(Key)? {
            msgpack::write_str(self.out, key.as_bytes());
            let field = match self.mode {
                Mode::Object(level) => (self.plan)(level, &key),
                _ => Field::Read,
            };
            match field {
                Field::Read => entries.next_value_seed(self.inner(Mode::Value))?,
                Field::Object(level) => entries.next_value_seed(self.inner(Mode::Object(level)))?,
                Field::Objects(level) => {
                    entries.next_value_seed(self.inner(Mode::Objects(level)))?;
                }
                Field::Copied => {
                    let raw: &RawValue = entries.next_value()?;
                    carry(self.out, raw.get(), self.depth + 1)
                        .ok_or_else(|| A::Error::custom("declined"))?;
                }
            }
            n += 1;
        }
        Convert::header(self.out, start, n, true);
        Ok(())
    }
}

/// Appends JSON text as a [`CARRIED`] ext value when the value-tree path
/// would read it, within the nesting left at `depth`; `None` otherwise. A
/// value serde_json skips is checked less (an exponent out of range, a lone
/// surrogate escape, nesting): [`read_alike`] says when that is all the
/// same, else [`Walk`] reads it whole as that path would.
fn carry(out: &mut Vec<u8>, text: &str, depth: usize) -> Option<()> {
    if !read_alike(text.as_bytes(), depth) {
        let mut reader = serde_json::Deserializer::from_str(text);
        Walk { depth, left: None }.deserialize(&mut reader).ok()?;
    }
    let _ = rmp::encode::write_ext_meta(out, u32::try_from(text.len()).ok()?, CARRIED);
    out.extend_from_slice(text.as_bytes());
    Some(())
}

/// Whether serde_json's skip, which took `text` as one JSON value, has
/// checked all that [`Walk`] would, for a value at `depth`: `text` holds
/// no escape (so no lone surrogate), no `e` or `E` after a digit (so no
/// exponent) and no run of more than 300 digits (so every number is within
/// an f64's range), and fewer brackets than the nesting left. The tests
/// look inside strings too; `false` only says [`Walk`] must read it.
fn read_alike(text: &[u8], depth: usize) -> bool {
    if memchr::memchr(b'\\', text).is_some() {
        return false;
    }
    if text.first() == Some(&b'"') {
        // A string, and nothing else.
        return true;
    }
    let after_digit = |at: usize| at.checked_sub(1).and_then(|i| text.get(i));
    let exponent = memchr::memchr2_iter(b'e', b'E', text)
        .any(|at| after_digit(at).is_some_and(u8::is_ascii_digit));
    // Every run of more than 300 digits holds one index of each remainder
    // by 301: measuring the runs through every 301st byte finds them all.
    let run_through = |at: usize| {
        let (before, after) = text.split_at_checked(at).unwrap_or_default();
        let digit = |b: &&u8| b.is_ascii_digit();
        before.iter().rev().take_while(digit).count() + after.iter().take_while(digit).count()
    };
    let long_run = (300..text.len())
        .step_by(301)
        .any(|at| run_through(at) > 300);
    // Each container opened in the text is closed in it too: at most half
    // its bytes open one, and shorter texts need no count.
    let nests_in_bounds = |opened: usize| may_open(depth + opened);
    let nesting = nests_in_bounds(text.len() / 2)
        || nests_in_bounds(memchr::memchr2_iter(b'[', b'{', text).count());
    !exponent && !long_run && nesting
}

/// Whether the JSON `bytes` hold more than `limit` values, every scalar,
/// array, map, key and item counted (`count::more_values_than`); `false`
/// for a body that is not valid, or nests deeper than [`super::MAX_DEPTH`], before
/// the count runs out.
pub(super) fn more_values_than(bytes: &[u8], limit: usize) -> bool {
    let left = Cell::new(limit);
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let walk = Walk {
        depth: 0,
        left: Some(&left),
    };
    match walk.deserialize(&mut reader) {
        Ok(()) => false,
        // serde errors are text, the position appended.
        Err(e) => e.to_string().starts_with(OVER),
    }
}

/// The error text of a count run out.
const OVER: &str = "more values than the limit";

/// Reads one JSON value whole and keeps nothing, refusing a container
/// where none [`may_open`] below `depth`, and counting every value off
/// `left` when given: [`carry`]'s check and [`more_values_than`]'s count.
#[derive(Clone, Copy)]
struct Walk<'c> {
    /// The containers around the value.
    depth: usize,
    left: Option<&'c Cell<usize>>,
}

impl Walk<'_> {
    fn one<E: serde::de::Error>(self) -> Result<(), E> {
        let Some(left) = self.left else {
            return Ok(());
        };
        let rest = left.get().checked_sub(1).ok_or_else(|| E::custom(OVER))?;
        left.set(rest);
        Ok(())
    }

    /// The walk inside a container, once it may open.
    fn open<E: serde::de::Error>(self) -> Result<Self, E> {
        if !may_open(self.depth) {
            return Err(E::custom("too deep"));
        }
        self.one()?;
        Ok(Walk {
            depth: self.depth + 1,
            ..self
        })
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.one()
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.one()
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.one()
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.one()
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.one()
    }

    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.one()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        let inner = self.open()?;
        while items.next_element_seed(inner)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<(), A::Error> {
        let inner = self.open()?;
        while entries.next_key_seed(inner)?.is_some() {
            entries.next_value_seed(inner)?;
        }
        Ok(())
    }
}

/// An object's key, borrowed from the body unless it holds escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(s))
    }

    fn visit_str<E>(self, s: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s.to_owned()))
    }
}

pub(super) fn to_json(value: &Value) -> Json {
    match value {
        Value::Nil => Json::Null,
        Value::Boolean(b) => Json::Bool(*b),
        Value::Integer(i) => {
            if let Some(u) = i.as_u64() {
                Json::from(u)
            } else if let Some(s) = i.as_i64() {
                Json::from(s)
            } else {
                Json::Null
            }
        }
        Value::F32(f) => {
            serde_json::Number::from_f64(f64::from(*f)).map_or(Json::Null, Json::Number)
        }
        Value::F64(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Value::String(s) => Json::String(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        Value::Binary(b) => Json::Array(b.iter().map(|x| Json::from(*x)).collect()),
        Value::Array(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(entries) => Json::Object(
            entries
                .iter()
                .map(|(k, v)| (key_string(k), to_json(v)))
                .collect(),
        ),
        Value::Ext(tag, data) => serde_json::json!({
            "ext_type": tag,
            "data": data,
        }),
    }
}

fn key_string(key: &Value) -> String {
    match key {
        Value::String(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => other.to_string(),
    }
}
