//! JSON to MessagePack and back without value trees, for the in-place
//! decision of JSON results (`decision::fast_json`): a JSON body is read
//! into the canonical MessagePack the in-place decision reads, and its output
//! is written back as JSON.
//!
//! Both directions are exact: a JSON body read here gives the bytes that
//! decoding it into a value tree and writing that as MessagePack would give
//! (and is refused whenever that decode fails), and MessagePack written back
//! gives the bytes [`super::encode`] gives as JSON. One exception, undone on
//! the way back: values the decision copies without reading (a [`Plan`]
//! names them) are carried as their JSON text when it is already canonical
//! (`raw`). What a token-by-token reader costs against the tree is in
//! `docs/performance.md`.

mod from_json;
mod raw;
mod to_json;
mod word;

pub use from_json::json_to_msgpack;
pub use raw::carried;
pub use to_json::msgpack_to_json;

/// What the reader does with the value under an object's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// Converted to MessagePack: the value is read.
    Converted,
    /// Carried as its JSON text when that is canonical, else converted:
    /// the value is only copied.
    Copied,
    /// An object read at the plan's level given; any other value converted.
    Object(u8),
    /// An array whose objects are read at the plan's level given; its other
    /// items, and any other value, converted.
    Objects(u8),
}

/// Which values of a JSON object the reader converts and which it may
/// carry as text: what the reader of the MessagePack reads and what it only
/// copies. Levels are the plan's own numbers; the top level is 0.
pub trait Plan {
    /// What to do with the value under `key` (canonical MessagePack) in an
    /// object at `level`.
    fn field(&self, level: u8, key: &[u8]) -> Field;
}

/// The plan that converts every value.
pub struct ConvertAll;

impl Plan for ConvertAll {
    fn field(&self, _: u8, _: &[u8]) -> Field {
        Field::Converted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Encoding, MAX_DEPTH, decode, encode, msgpack, try_encode};

    /// Each body read here gives what the value tree gives, or is refused
    /// exactly when the tree's decode fails (or the top level is not an
    /// object); what is read writes back as the tree's encoder writes it.
    #[test]
    fn both_directions_agree_with_the_value_tree() {
        let nested =
            |levels: usize| format!("{{\"a\":{}0{}}}", "[".repeat(levels), "]".repeat(levels));
        let bodies = [
            r#"{"a":1,"b":[1,22,333,4444,55555,18446744073709551615]}"#.to_string(),
            r#"{"n":-0,"f":1.0,"e":1e3,"g":-1.5E-7,"big":18446744073709551616,"neg":-9223372036854775808}"#.into(),
            r#" { "a" : [ true , false , null ] , "b" : { } , "c" : [ ] } "#.into(),
            r#"{"s":"plain","t":"tab\tquote\"slash\/u\u00e9\ud83d\ude00 ctl\u0001","é":"ü"}"#.into(),
            r#"{"k":"a","k":"b","\u006b":"c"}"#.into(),
            format!("{{\"wide\":[{}]}}", vec!["7"; 70_000].join(",")),
            nested(MAX_DEPTH - 1),
            nested(MAX_DEPTH),
            r#"{"lone":"\ud800"}"#.into(),
            "{\"raw\":\"a\u{1}b\"}".into(),
            r#"{"lead":01}"#.into(),
            r#"{"huge":1e400}"#.into(),
            r#"{"a":1} x"#.into(),
            r#"{"a":1,}"#.into(),
            r#"{"a" 1}"#.into(),
            r#"[1]"#.into(),
            r#"{"a":tru}"#.into(),
            String::new(),
        ];
        let mut extra = vec![b"{\"bad\":\"\xff\"}".to_vec()];
        extra.extend(bodies.iter().map(|b| b.as_bytes().to_vec()));
        for body in extra {
            let tree = decode(&body, Encoding::Json).ok().filter(|v| v.is_map());
            let mut mp = Vec::new();
            let read = json_to_msgpack(&body, &mut mp, &ConvertAll);
            let mut carried = Vec::new();
            let read_carried = json_to_msgpack(&body, &mut carried, &CopyAll);
            let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
            match tree {
                Some(value) => {
                    assert_eq!(read, Some(()), "{shown}");
                    assert_eq!(read_carried, Some(()), "{shown}");
                    assert_eq!(mp, encode(&value, Encoding::MsgPack), "{shown}");
                    let json =
                        try_encode(&value, Encoding::Json, 0).expect("JSON carries what it gave");
                    assert_eq!(msgpack_to_json(&mp, 0), Ok(json.clone()), "{shown}");
                    assert_eq!(msgpack_to_json(&carried, 0), Ok(json), "{shown}");
                }
                None => {
                    assert_eq!(read, None, "{shown}");
                    assert_eq!(read_carried, None, "{shown}");
                }
            }
        }
    }

    /// Every value of every object copied: carried as text where it can be.
    struct CopyAll;

    impl Plan for CopyAll {
        fn field(&self, _: u8, _: &[u8]) -> Field {
            Field::Copied
        }
    }

    /// Values carried as their text, compact or spaced as other producers
    /// write them, are written back as the value tree writes them; a
    /// spaced value is carried (not converted) once compacted.
    #[test]
    fn carried_values_write_back_as_the_tree_writes_them() {
        let bodies = [
            r#"{"r": {"model": "m", "token_ids": [1, 22, 333], "s": {"t": 0.7, "p": 0.95}}}"#,
            "{\"r\":\n  [ 1 ,\t2 , {\"a\" : [ ] , \"b\":{ }} ]\r\n}",
            r#"{"r": [1.0, 1e3, -0, "tab\t", "\u0041"], "s": "x y"}"#,
            r#"{"r": ["é", "a b", {"k": null, "k": true}]}"#,
        ];
        for body in bodies {
            let value = decode(body.as_bytes(), Encoding::Json).unwrap();
            let mut carried = Vec::new();
            json_to_msgpack(body.as_bytes(), &mut carried, &CopyAll).unwrap();
            assert_eq!(
                msgpack_to_json(&carried, 0),
                Ok(encode(&value, Encoding::Json)),
                "{body}"
            );
        }
        // The first two are carried whole: one ext value under "r".
        for body in &bodies[..2] {
            let mut carried = Vec::new();
            json_to_msgpack(body.as_bytes(), &mut carried, &CopyAll).unwrap();
            let value = crate::wire::msgpack::read(&carried).unwrap();
            let first = value.as_map().and_then(|m| m.first()).map(|(_, v)| v);
            assert!(matches!(first, Some(rmpv::Value::Ext(0x4a, _))), "{body}");
        }
    }

    /// What JSON cannot carry is an error on both writers, never a stand-in
    /// (`null`, an array of bytes, a key's display form): each row a
    /// MessagePack body and whether the value tree reads it at all.
    #[test]
    fn values_json_cannot_carry_are_refused_not_written() {
        let rows: [(&str, &[u8], bool); 7] = [
            ("binary", b"\x81\xa1a\xc4\x02\x01\x02", true),
            ("ext", b"\x81\xa1a\xd4\x05\x00", true),
            ("integer key", b"\x81\x01\x02", true),
            ("string not UTF-8", b"\x81\xa1a\xa1\xff", true),
            ("undefined marker", b"\x81\xa1a\xc1", false),
            ("truncated", b"\x82\xa1a\x01", false),
            ("trailing bytes", b"\x80\x00", false),
        ];
        for (what, body, tree_reads) in rows {
            assert!(msgpack_to_json(body, 0).is_err(), "{what}");
            match msgpack::read(body) {
                Ok(value) => {
                    assert!(tree_reads, "{what}");
                    assert!(try_encode(&value, Encoding::Json, 0).is_err(), "{what}");
                    let mp = try_encode(&value, Encoding::MsgPack, 0);
                    assert_eq!(mp.as_deref(), Ok(body), "{what}");
                }
                Err(_) => assert!(!tree_reads, "{what}"),
            }
        }
        for float in [f64::NAN, f64::INFINITY] {
            let value = rmpv::Value::Array(vec![rmpv::Value::F64(float)]);
            assert!(try_encode(&value, Encoding::Json, 0).is_err(), "{float}");
        }
    }
}
