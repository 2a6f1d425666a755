//! Reads the few top-level fields the matcher needs from a MessagePack map
//! without decoding the rest.
//!
//! The collector sees every output of a run on one task; a full decode of
//! each decode job would make the load generator, not the worker, the
//! bottleneck. Input comes from the network: every read is bounds-checked and
//! nesting is limited, so hostile bytes yield `None`, never a panic.

/// The top-level fields of one output that identify it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fields<'a> {
    pub request_id: Option<&'a str>,
    /// `kind` of a response (`terminal`, `error`).
    pub kind: Option<&'a str>,
    /// A decode job has `backend`.
    pub has_backend: bool,
    /// A prefill result (relayed unchanged) has `frames`.
    pub has_frames: bool,
}

const MAX_DEPTH: usize = 64;

/// The fields of a MessagePack map or a JSON object (the outputs of a JSON
/// run: a JSON object starts with `{`, a MessagePack positive integer), or
/// `None` when the bytes are neither.
pub fn scan(bytes: &[u8]) -> Option<Fields<'_>> {
    if bytes.first() == Some(&b'{') {
        return scan_json(bytes);
    }
    let mut r = Reader { bytes, pos: 0 };
    let entries = match r.u8()? {
        b @ 0x80..=0x8f => usize::from(b & 0x0f),
        0xde => r.be(2)?,
        0xdf => r.be(4)?,
        _ => return None,
    };
    let mut fields = Fields::default();
    for _ in 0..entries {
        let key = r.str_or_skip()?;
        match key {
            Some("request_id") => fields.request_id = r.str_or_skip()?,
            Some("kind") => fields.kind = r.str_or_skip()?,
            Some("backend") => {
                fields.has_backend = true;
                r.skip(0)?;
            }
            Some("frames") => {
                fields.has_frames = true;
                r.skip(0)?;
            }
            _ => r.skip(0)?,
        }
    }
    Some(fields)
}

/// The fields of a JSON object: serde_json skips the rest without building
/// it. Request IDs and kinds are plain strings, borrowed from the bytes.
fn scan_json(bytes: &[u8]) -> Option<Fields<'_>> {
    #[derive(serde::Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        request_id: Option<&'a str>,
        #[serde(borrow)]
        kind: Option<&'a str>,
        backend: Option<serde::de::IgnoredAny>,
        frames: Option<serde::de::IgnoredAny>,
    }
    let top: Top<'_> = serde_json::from_slice(bytes).ok()?;
    Some(Fields {
        request_id: top.request_id,
        kind: top.kind,
        has_backend: top.backend.is_some(),
        has_frames: top.frames.is_some(),
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// A big-endian unsigned length of `n` bytes.
    fn be(&mut self, n: usize) -> Option<usize> {
        let raw = self.take(n)?;
        Some(
            raw.iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b)),
        )
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    /// Reads a string value (`Some(s)`), or skips any other value (`None`).
    /// Fails only on bytes that are not MessagePack.
    fn str_or_skip(&mut self) -> Option<Option<&'a str>> {
        let len = match *self.bytes.get(self.pos)? {
            b @ 0xa0..=0xbf => {
                self.pos += 1;
                usize::from(b & 0x1f)
            }
            0xd9..=0xdb => {
                let width = match self.u8()? {
                    0xd9 => 1,
                    0xda => 2,
                    _ => 4,
                };
                self.be(width)?
            }
            _ => {
                self.skip(0)?;
                return Some(None);
            }
        };
        let raw = self.take(len)?;
        Some(std::str::from_utf8(raw).ok())
    }

    /// Skips one complete value.
    fn skip(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        let b = self.u8()?;
        let (payload, items) = match b {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * usize::from(b & 0x0f)),
            0x90..=0x9f => (0, usize::from(b & 0x0f)),
            0xa0..=0xbf => (usize::from(b & 0x1f), 0),
            0xc4 | 0xd9 => (self.be(1)?, 0),
            0xc5 | 0xda => (self.be(2)?, 0),
            0xc6 | 0xdb => (self.be(4)?, 0),
            0xc7 => (self.be(1)? + 1, 0),
            0xc8 => (self.be(2)? + 1, 0),
            0xc9 => (self.be(4)?.checked_add(1)?, 0),
            0xca => (4, 0),
            0xcb => (8, 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xce | 0xd2 => (4, 0),
            0xcf | 0xd3 => (8, 0),
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xdc => (0, self.be(2)?),
            0xdd => (0, self.be(4)?),
            0xde => (0, self.be(2)?.checked_mul(2)?),
            0xdf => (0, self.be(4)?.checked_mul(2)?),
            // 0xc1 is never used.
            _ => return None,
        };
        self.take(payload)?;
        for _ in 0..items {
            self.skip(depth + 1)?;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{from_pairs, to_msgpack};
    use rmpv::Value;

    fn enc(v: &Value) -> Vec<u8> {
        to_msgpack(v)
    }

    /// Every MessagePack type, to be skipped on the way to the fields we want.
    fn everything() -> Value {
        from_pairs([
            ("nil", Value::Nil),
            ("b", Value::from(true)),
            ("neg", Value::from(-5)),
            ("i8", Value::from(-100)),
            ("u64", Value::from(u64::MAX)),
            ("i64", Value::from(i64::MIN)),
            ("f32", Value::F32(1.5)),
            ("f64", Value::F64(2.5)),
            ("s8", Value::from("x".repeat(40))),
            ("s16", Value::from("y".repeat(300))),
            ("s32", Value::from("z".repeat(70_000))),
            ("bin", Value::Binary(vec![1; 300])),
            ("ext1", Value::Ext(1, vec![9])),
            ("ext16", Value::Ext(2, vec![9; 16])),
            ("ext3", Value::Ext(3, vec![9; 3])),
            ("arr", Value::Array((0..20).map(Value::from).collect())),
            (
                "nested",
                from_pairs([("request_id", Value::from("inner")), ("k", Value::Nil)]),
            ),
            (
                "bigmap",
                Value::Map((0..20).map(|i| (Value::from(i), Value::from(i))).collect()),
            ),
        ])
    }

    #[test]
    fn finds_top_level_fields_past_every_value_type() {
        let Value::Map(mut entries) = everything() else {
            unreachable!()
        };
        entries.push((Value::from("request_id"), Value::from("lg-r-1")));
        entries.push((Value::from("kind"), Value::from("terminal")));
        entries.push((Value::from(7), Value::from("non-string key")));
        let bytes = enc(&Value::Map(entries));
        let f = scan(&bytes).expect("a map");
        assert_eq!(f.request_id, Some("lg-r-1"));
        assert_eq!(f.kind, Some("terminal"));
        assert!(!f.has_backend && !f.has_frames);
    }

    #[test]
    fn table() {
        let decode_job = from_pairs([
            ("request_id", Value::from("a")),
            ("backend", Value::from("trtllm")),
            ("handoff", everything()),
        ]);
        let relayed = from_pairs([
            ("frames", Value::Array(vec![everything()])),
            ("request_id", Value::from("b")),
        ]);
        let big_map = Value::Map(
            (0..40)
                .map(|i| (Value::from(format!("k{i}")), Value::from(i)))
                .chain([(Value::from("request_id"), Value::from("c"))])
                .collect(),
        );
        let non_string_id = from_pairs([("request_id", Value::from(5))]);
        let rows: Vec<(&str, Vec<u8>, Option<Fields>)> = vec![
            (
                "decode job",
                enc(&decode_job),
                Some(Fields {
                    request_id: Some("a"),
                    has_backend: true,
                    ..Fields::default()
                }),
            ),
            (
                "relayed",
                enc(&relayed),
                Some(Fields {
                    request_id: Some("b"),
                    has_frames: true,
                    ..Fields::default()
                }),
            ),
            (
                "map16",
                enc(&big_map),
                Some(Fields {
                    request_id: Some("c"),
                    ..Fields::default()
                }),
            ),
            (
                "non-string id",
                enc(&non_string_id),
                Some(Fields::default()),
            ),
            ("array", enc(&Value::Array(vec![])), None),
            ("empty", vec![], None),
            ("truncated", enc(&decode_job)[..20].to_vec(), None),
            (
                "claims 2^32 entries",
                vec![0xdf, 0xff, 0xff, 0xff, 0xff],
                None,
            ),
            (
                "huge str length",
                vec![0x81, 0xdb, 0xff, 0xff, 0xff, 0xff],
                None,
            ),
            ("reserved byte", vec![0x81, 0xa1, b'x', 0xc1], None),
            (
                "json object",
                br#"{"request_id":"a"}"#.to_vec(),
                Some(Fields {
                    request_id: Some("a"),
                    ..Fields::default()
                }),
            ),
            (
                "json, not an object",
                br#"["request_id","a"]"#.to_vec(),
                None,
            ),
            (
                "invalid utf-8 id",
                vec![
                    0x81, 0xaa, b'r', b'e', b'q', b'u', b'e', b's', b't', b'_', b'i', b'd', 0xa1,
                    0xff,
                ],
                Some(Fields::default()),
            ),
        ];
        for (name, bytes, want) in rows {
            assert_eq!(scan(&bytes), want, "{name}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let mut bytes = vec![0x81, 0xa1, b'x'];
        bytes.extend(std::iter::repeat_n(0x91, 100_000));
        bytes.push(0xc0);
        assert_eq!(scan(&bytes), None);
    }
}
