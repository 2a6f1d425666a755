//! Counting the values of a body without building them: how large a value
//! tree of it would be, found in one linear pass with no allocation.
//!
//! A value tree costs tens of bytes per value however small the value's
//! encoding (`nil` is one byte of MessagePack, five of JSON), so a 1 MiB
//! array of `nil` is many times its size as a tree (`docs/performance.md`,
//! "Figures behind choices in the code"). The decision asks
//! [`more_values_than`] before it builds one (see `decision::decide`).

use super::{Encoding, scan};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::cell::Cell;
use std::fmt;

/// Whether `bytes` holds more than `limit` values (every scalar, array, map,
/// key and item counts one). Stops counting at `limit + 1`. A body that is
/// not valid (or nests deeper than [`super::MAX_DEPTH`]) before that point answers
/// `false`: reading it as a tree fails within `limit` values too.
pub fn more_values_than(bytes: &[u8], encoding: Encoding, limit: usize) -> bool {
    // Every value takes at least one byte in either encoding (a JSON
    // string, key or not, takes two), so a body of at most `limit` bytes
    // holds at most `limit` values: no need to count. Typical results are a few KiB
    // against a limit of 32,768, and counting a small JSON result costs
    // about as much as deciding it.
    if bytes.len() <= limit {
        return false;
    }
    match encoding {
        Encoding::MsgPack => {
            let mut left = limit;
            scan::any_end(bytes, 0, 0, &mut left) == Err(scan::Stop::Over)
        }
        Encoding::Json => {
            let left = Cell::new(limit);
            let mut de = serde_json::Deserializer::from_slice(bytes);
            match (Counter { left: &left }).deserialize(&mut de) {
                Ok(()) => false,
                Err(e) => e.to_string().starts_with(OVER),
            }
        }
    }
}

/// The error text that means "over the limit" (serde errors are strings).
const OVER: &str = "more values than the limit";

/// Counts one JSON value and everything in it. serde_json bounds the
/// recursion (128 levels) and reuses one scratch buffer for escaped strings.
#[derive(Clone, Copy)]
struct Counter<'c> {
    left: &'c Cell<usize>,
}

impl Counter<'_> {
    fn one<E: de::Error>(self) -> Result<(), E> {
        match self.left.get().checked_sub(1) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => Err(E::custom(OVER)),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Counter<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Counter<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.one()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.one()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.one()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.one()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.one()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.one()
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.one()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.one()?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.one()?;
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{MAX_DEPTH, decode, encode, msgpack};
    use proptest::prelude::*;
    use rmpv::Value;

    /// Every value of a tree: itself plus everything inside.
    fn values(v: &Value) -> usize {
        1 + match v {
            Value::Array(items) => items.iter().map(values).sum(),
            Value::Map(entries) => entries.iter().map(|(k, v)| values(k) + values(v)).sum(),
            _ => 0,
        }
    }

    #[test]
    fn counts_what_a_tree_would_hold_in_both_encodings() {
        let body = Value::Map(vec![
            (Value::from("a"), Value::Array(vec![Value::Nil; 40])),
            (Value::from("b"), Value::from(-300)),
            (
                Value::from("c"),
                Value::Map(vec![(Value::from("d"), Value::F64(1.5))]),
            ),
        ]);
        let n = values(&body);
        for encoding in [Encoding::MsgPack, Encoding::Json] {
            let bytes = encode(&body, encoding);
            assert_eq!(values(&decode(&bytes, encoding).unwrap()), n);
            assert!(more_values_than(&bytes, encoding, n - 1), "{encoding:?}");
            assert!(!more_values_than(&bytes, encoding, n), "{encoding:?}");
        }
    }

    /// The shortcut (a body of at most `limit` bytes holds at most `limit`
    /// values) is exact at its edge: the densest bodies hold one value per
    /// byte, and one more byte's worth of limit is counted as over.
    #[test]
    fn the_densest_bodies_hold_one_value_per_byte() {
        for depth in 1..=MAX_DEPTH {
            // `depth` nested arrays, the innermost empty: one byte each.
            let mut bytes = vec![0x91u8; depth - 1];
            bytes.push(0x90);
            assert_eq!(values(&decode(&bytes, Encoding::MsgPack).unwrap()), depth);
            assert!(!more_values_than(&bytes, Encoding::MsgPack, depth));
            assert!(
                more_values_than(&bytes, Encoding::MsgPack, depth - 1),
                "{depth}"
            );
        }
        // A run of positive fixints in an array16: n + 1 values in n + 3 bytes.
        let mut bytes = vec![0xdc, 0x01, 0x00];
        bytes.extend(std::iter::repeat_n(7u8, 256));
        assert!(more_values_than(&bytes, Encoding::MsgPack, 256));
        assert!(!more_values_than(&bytes, Encoding::MsgPack, 257));
        for (json, n) in [(&b"1"[..], 1), (b"[]", 1), (b"[[]]", 2), (b"[1,2,3]", 4)] {
            assert!(!more_values_than(json, Encoding::Json, n), "{json:?}");
            assert!(more_values_than(json, Encoding::Json, n - 1), "{json:?}");
        }
    }

    #[test]
    fn non_canonical_msgpack_counts_too() {
        // array32 of 3 nils, an uint64 holding 1.
        let bytes = [0xdd, 0, 0, 0, 3, 0xc0, 0xc0, 0xcf, 0, 0, 0, 0, 0, 0, 0, 1];
        assert!(more_values_than(&bytes, Encoding::MsgPack, 3));
        assert!(!more_values_than(&bytes, Encoding::MsgPack, 4));
    }

    #[test]
    fn invalid_bodies_within_the_limit_are_left_to_the_reader() {
        for bytes in [&[0x93, 0xc0][..], &[0xc1], &[0xdd, 0xff, 0xff, 0xff, 0xff]] {
            assert!(
                !more_values_than(bytes, Encoding::MsgPack, 10),
                "{bytes:x?}"
            );
        }
        assert!(!more_values_than(b"[null, nul", Encoding::Json, 10));
        assert!(more_values_than(b"[null, null, nul", Encoding::Json, 2));
    }

    /// Where the reference reader ([`msgpack::read`]) ends the value at the
    /// start of `bytes`, read inside one container as `any_end` reads
    /// it: the one prefix it reads whole (a valid value has one length).
    fn reference_end(bytes: &[u8]) -> Option<usize> {
        (1..=bytes.len()).find(|&end| {
            let mut inside = vec![0x91];
            inside.extend_from_slice(&bytes[..end]);
            msgpack::read(&inside).is_ok()
        })
    }

    /// Any value tree, scalars of every kind and width, strings and binary
    /// data either side of the 8-bit lengths.
    fn any_value() -> impl Strategy<Value = Value> {
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
        prop_oneof![
            proptest::collection::vec(byte, 0..48),
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
        /// [`scan::any_end`], the walk that counts values and finds the
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
                scan::any_end(&bytes, pos, 1, &mut { usize::MAX }).ok(),
                reference_end(&bytes[pos..]).map(|end| pos + end),
                "{:x?} from {}", bytes, pos
            );
        }

        /// On a readable body the count is the tree's, at every limit.
        #[test]
        fn the_count_is_the_trees(value in any_value()) {
            let bytes = encode(&value, Encoding::MsgPack);
            let tree = decode(&bytes, Encoding::MsgPack).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let n = values(&tree);
            for limit in 0..=n + 1 {
                prop_assert_eq!(more_values_than(&bytes, Encoding::MsgPack, limit), n > limit, "{} values, limit {}", n, limit);
            }
        }
    }
}
