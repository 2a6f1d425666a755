//! JSON in, canonical MessagePack out, in one pass with no value tree.
//!
//! The output is byte for byte what [`crate::wire::decode`] (serde_json into
//! a value tree) followed by [`crate::wire::msgpack::write`] would give
//! (except the values a [`Plan`] marks [`Field::Copied`] whose text is
//! canonical, carried as that text: `raw`), and
//! the reader refuses (`None`) every body that path refuses: not one complete
//! JSON value, invalid UTF-8, a control character or a bad escape in a
//! string, a number serde_json cannot read, nesting past [`MAX_DEPTH`].
//! It refuses a top level that is not an object too: the decision reads
//! nothing else in place.
//!
//! The common tokens are read here (plain strings, non-negative integers,
//! literals); the rare ones (strings with escapes, negative or fractional
//! numbers, integers past 19 digits) are handed to serde_json one token at a
//! time, so that their values are serde_json's by construction.

use super::{Field, Plan, raw, word};
use crate::wire::{MAX_DEPTH, msgpack};
use rmpv::Value;

/// Appends the MessagePack form of the JSON object `json` to `out`, its
/// values carried or converted as `plan` says (the top level is the plan's
/// level 0); `None` (with `out` holding a partial value) when it is not one
/// valid JSON object within the bounds above.
pub fn json_to_msgpack(json: &[u8], out: &mut Vec<u8>, plan: &impl Plan) -> Option<()> {
    let mut reader = Reader {
        b: json,
        p: 0,
        out,
        plan,
    };
    reader.ws();
    if reader.peek()? != b'{' {
        return None;
    }
    reader.entries(1, Some(0))?;
    reader.ws();
    (reader.p == json.len()).then_some(())
}

struct Reader<'a, 'o, P> {
    b: &'a [u8],
    p: usize,
    out: &'o mut Vec<u8>,
    plan: &'o P,
}

impl<P: Plan> Reader<'_, '_, P> {
    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.p).copied()
    }

    /// Skips JSON whitespace (space, tab, CR, LF).
    #[inline(always)]
    fn ws(&mut self) {
        while let Some(c) = self.peek() {
            if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                break;
            }
            self.p += 1;
        }
    }

    /// The value at `p`, which sits in `depth` containers.
    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string(),
            b't' => self.literal(b"true", 0xc3),
            b'f' => self.literal(b"false", 0xc2),
            b'n' => self.literal(b"null", 0xc0),
            _ => self.number(),
        }
    }

    fn literal(&mut self, word: &[u8], marker: u8) -> Option<()> {
        let end = self.p + word.len();
        (self.b.get(self.p..end)? == word).then_some(())?;
        self.out.push(marker);
        self.p = end;
        Some(())
    }

    /// An object at nesting level `depth` (the top level is 1), every value
    /// converted.
    fn object(&mut self, depth: usize) -> Option<()> {
        self.entries(depth, None)
    }

    /// An object at nesting level `depth`; at a plan's `level`, each value
    /// is read as the plan says for its key, else converted.
    fn entries(&mut self, depth: usize, level: Option<u8>) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.p += 1;
        let header = self.out.len();
        self.out.push(0x80);
        let mut n = 0;
        self.ws();
        if self.peek()? == b'}' {
            self.p += 1;
            return Some(());
        }
        loop {
            self.ws();
            if self.peek()? != b'"' {
                return None;
            }
            let key = self.out.len();
            self.string()?;
            let field = match level {
                Some(level) => self.plan.field(level, &self.out[key..]),
                None => Field::Converted,
            };
            self.ws();
            if self.peek()? != b':' {
                return None;
            }
            self.p += 1;
            self.ws();
            match (field, self.peek()?) {
                (Field::Object(level), b'{') => self.entries(depth + 1, Some(level))?,
                (Field::Objects(level), b'[') => self.items(depth + 1, Some(level))?,
                // A literal is as cheap to convert as to carry.
                (Field::Copied, b'n' | b't' | b'f') => self.value(depth)?,
                (Field::Copied, _) if self.carried(depth) => {}
                _ => self.value(depth)?,
            }
            n += 1;
            self.ws();
            match self.peek()? {
                b',' => self.p += 1,
                b'}' => break,
                _ => return None,
            }
        }
        self.p += 1;
        self.finish(header, n, 0x80, 0xde);
        Some(())
    }

    /// The value at `p` kept as its JSON text when that text is canonical
    /// ([`raw::canonical_end`]), or is once the whitespace between its
    /// tokens is taken out (a container as Python's `json.dumps` writes it,
    /// `", "` and `": "`); `false`, with nothing read, otherwise.
    fn carried(&mut self, depth: usize) -> bool {
        if let Some(end) = raw::canonical_end::<false>(self.b, self.p, depth)
            && raw::write(self.out, &self.b[self.p..end])
        {
            self.p = end;
            return true;
        }
        if !matches!(self.peek(), Some(b'{' | b'[')) {
            return false;
        }
        match raw::canonical_end::<true>(self.b, self.p, depth) {
            Some(end) if raw::write(self.out, &raw::compact(&self.b[self.p..end])) => {
                self.p = end;
                true
            }
            _ => false,
        }
    }

    /// An array at nesting level `depth`, every item converted.
    fn array(&mut self, depth: usize) -> Option<()> {
        self.items(depth, None)
    }

    /// An array at nesting level `depth`; its objects read at a plan's
    /// `level`. Integers, the usual items (token IDs), are read without a
    /// turn through [`Reader::value`].
    fn items(&mut self, depth: usize, level: Option<u8>) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.p += 1;
        let header = self.out.len();
        self.out.push(0x90);
        let mut n = 0;
        self.ws();
        if self.peek()? == b']' {
            self.p += 1;
            return Some(());
        }
        loop {
            self.ws();
            match (self.peek()?, level) {
                (b'0'..=b'9', _) => self.number()?,
                (b'{', Some(_)) => self.entries(depth + 1, level)?,
                _ => self.value(depth)?,
            }
            n += 1;
            self.ws();
            match self.peek()? {
                b',' => self.p += 1,
                b']' => break,
                _ => return None,
            }
        }
        self.p += 1;
        self.finish(header, n, 0x90, 0xdc);
        Some(())
    }

    /// Writes the header of a container of `n` values whose one-byte
    /// placeholder is at `header`: a fix form in place, a wider one moved
    /// in (rare: 16 values or more).
    fn finish(&mut self, header: usize, n: usize, fix: u8, wide16: u8) {
        if n < 16 {
            self.out[header] = fix | n as u8;
        } else if let Ok(n16) = u16::try_from(n) {
            self.out[header] = wide16;
            self.out.splice(header + 1..header + 1, n16.to_be_bytes());
        } else {
            // A body is far below 4 GiB: a count always fits 32 bits.
            let n32 = u32::try_from(n).unwrap_or(u32::MAX);
            self.out[header] = wide16 + 1;
            self.out.splice(header + 1..header + 1, n32.to_be_bytes());
        }
    }

    /// A string. Without escapes its bytes are the value (checked as UTF-8
    /// when not ASCII), found eight at a time; with one, serde_json reads
    /// the whole token.
    fn string(&mut self) -> Option<()> {
        let start = self.p + 1;
        let (end, ascii) = word::text_end(self.b, start)?;
        match self.b[end] {
            b'"' => {}
            b'\\' => return self.escaped_string(),
            _ => return None,
        }
        let n = end - start;
        if ascii && n < 32 {
            // Keys, IDs, subjects: a fixstr.
            self.out.push(0xa0 | n as u8);
            word::copy(self.out, self.b, start, n)?;
        } else {
            let bytes = &self.b[start..end];
            if !ascii {
                std::str::from_utf8(bytes).ok()?;
            }
            msgpack::write_str(self.out, bytes);
        }
        self.p = end + 1;
        Some(())
    }

    /// A string with an escape: its token found (a backslash escapes the
    /// byte after it), then read by serde_json.
    fn escaped_string(&mut self) -> Option<()> {
        let b = self.b;
        let mut i = self.p + 1;
        loop {
            match *b.get(i)? {
                b'"' => break,
                b'\\' => i += 2,
                _ => i += 1,
            }
        }
        let text: String = serde_json::from_slice(b.get(self.p..=i)?).ok()?;
        msgpack::write_str(self.out, text.as_bytes());
        self.p = i + 1;
        Some(())
    }

    /// A number: a non-negative integer of at most 19 digits read here,
    /// anything else by serde_json.
    fn number(&mut self) -> Option<()> {
        let b = self.b;
        let start = self.p;
        let mut i = start;
        let mut n: u64 = 0;
        while let Some(&c) = b.get(i) {
            let digit = c.wrapping_sub(b'0');
            if digit > 9 {
                break;
            }
            // 19 digits cannot overflow; longer ones go to serde_json.
            n = n.wrapping_mul(10).wrapping_add(u64::from(digit));
            i += 1;
        }
        let digits = i - start;
        let plain = (1..=19).contains(&digits)
            && !matches!(b.get(i), Some(b'.' | b'e' | b'E' | b'-' | b'+'));
        if plain {
            // A leading zero is only the number zero itself.
            if digits > 1 && b[start] == b'0' {
                return None;
            }
            msgpack::write_uint(self.out, n);
            self.p = i;
            return Some(());
        }
        let end = start
            + b[start..]
                .iter()
                .position(|c| !matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                .unwrap_or(b.len() - start);
        if end == start {
            return None;
        }
        let value: Value = serde_json::from_slice(&b[start..end]).ok()?;
        msgpack::write(self.out, &value);
        self.p = end;
        Some(())
    }
}
