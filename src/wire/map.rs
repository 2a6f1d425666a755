//! Small helpers for reading and editing MessagePack maps in place.
//!
//! Maps are `Vec<(Value, Value)>` so key order and unknown entries survive.

use rmpv::Value;

/// The first value under a string key, if any.
pub fn get<'a>(map: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// Like [`get`], but a present `nil` counts as absent.
pub fn get_non_nil<'a>(map: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    get(map, key).filter(|v| !v.is_nil())
}

/// Whether the map holds the string key (even with a `nil` value).
pub fn has(map: &[(Value, Value)], key: &str) -> bool {
    get(map, key).is_some()
}

/// Sets a string key: replaces the first entry under it in place (keeping the
/// key's position), drops any later duplicates, or appends a new entry.
pub fn set(map: &mut Vec<(Value, Value)>, key: &str, value: Value) {
    let mut value = Some(value);
    map.retain_mut(|(k, v)| {
        if k.as_str() != Some(key) {
            return true;
        }
        match value.take() {
            Some(new) => {
                *v = new;
                true
            }
            None => false,
        }
    });
    if let Some(new) = value {
        map.push((Value::from(key), new));
    }
}

/// Removes the first entry under a string key and returns its value.
pub fn take(map: &mut Vec<(Value, Value)>, key: &str) -> Option<Value> {
    let i = map.iter().position(|(k, _)| k.as_str() == Some(key))?;
    Some(map.remove(i).1)
}

/// Removes every entry under a string key.
pub fn remove(map: &mut Vec<(Value, Value)>, key: &str) {
    map.retain(|(k, _)| k.as_str() != Some(key));
}

/// The first string key that appears more than once, if any. A map with a
/// duplicated key is ambiguous: we might validate one value while the decode
/// worker's parser reads the other.
pub fn duplicate_key(map: &[(Value, Value)]) -> Option<&str> {
    // Small maps (the usual case) are checked pairwise without allocating; a
    // large hostile map must not cost quadratic time.
    if map.len() <= 16 {
        for (i, (k, _)) in map.iter().enumerate() {
            if let Some(name) = k.as_str()
                && map[..i]
                    .iter()
                    .any(|(other, _)| other.as_str() == Some(name))
            {
                return Some(name);
            }
        }
        return None;
    }
    let mut seen = std::collections::HashSet::with_capacity(map.len());
    map.iter()
        .filter_map(|(k, _)| k.as_str())
        .find(|name| !seen.insert(*name))
}

/// Builds a map from string keys.
pub fn from_pairs<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    Value::Map(
        pairs
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}
