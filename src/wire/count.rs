//! Counting the values of a body without building them: how large a value
//! tree of it would be, found in one linear pass with no allocation.
//!
//! A value tree costs tens of bytes per value however small the value's
//! encoding (`nil` is one byte of MessagePack, five of JSON), so a 1 MiB
//! array of `nil` is many times its size as a tree (`docs/performance.md`,
//! "Figures behind choices in the code"). The decision asks
//! [`more_values_than`] before it builds one (see `decision::decide`).

use super::{Encoding, json, scan};

/// Whether `bytes` holds more than `limit` values (every scalar, array, map,
/// key and item counts one). Stops counting at `limit + 1`. A body that is
/// not valid (or nests deeper than [`super::MAX_DEPTH`]) before that point
/// answers `false`: reading it as a tree fails within `limit` values too.
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
        Encoding::Json => json::more_values_than(bytes, limit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::scan::tests::any_value;
    use crate::wire::{MAX_DEPTH, decode, encode};
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

    proptest! {
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
