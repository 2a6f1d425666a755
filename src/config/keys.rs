//! Every configuration key and the kind of value it takes.
//!
//! The file, the environment and the flags all go through this table, so a
//! key is known (or unknown) in the same way everywhere, and a string from
//! the environment or a flag is converted by the field's type.

use super::ConfigError;
use toml::Value;

use super::table::{KEYS, Key, Kind};

/// The known key.
pub(crate) fn lookup(key: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == key)
}

/// The tables of the file (`nats`, `nats.tls`, `etcd`, `etcd.tls`,
/// `subjects`, `jetstream`): every proper dotted prefix of a key.
pub(crate) fn is_section(name: &str) -> bool {
    KEYS.iter().any(|k| {
        k.name
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// The environment variable for a key: `nats.url` → `HANDOFF_NATS__URL`.
pub fn env_name(key: &str) -> String {
    format!("HANDOFF_{}", key.to_uppercase().replace('.', "__"))
}

/// "unknown key ...; did you mean ...?" for a key not in the table.
pub(crate) fn unknown(key: &str, how: impl Fn(&str) -> String) -> String {
    let mut text = format!("unknown configuration key `{key}`");
    if let Some(near) = nearest(key) {
        text.push_str(&format!("; did you mean {}?", how(near)));
    }
    text.push_str(" (every key is listed in config/handoff.toml)");
    text
}

fn nearest(key: &str) -> Option<&'static str> {
    KEYS.iter()
        .map(|k| (strsim::levenshtein(key, k.name), k.name))
        .filter(|(d, k)| {
            let close = *d <= (k.len().max(key.len()) / 3).max(2);
            let prefix = key.len() >= 4 && (k.starts_with(key) || key.starts_with(k));
            close || prefix
        })
        .min()
        .map(|(_, k)| k)
}

/// The kind's expectation, for messages and the reference.
pub(crate) fn expected(kind: Kind) -> String {
    match kind {
        Kind::Str => "a string".into(),
        Kind::OptStr | Kind::Secret => "a string (empty means unset)".into(),
        Kind::UInt => "a non-negative integer".into(),
        Kind::Int => "an integer".into(),
        Kind::Float => "a number".into(),
        Kind::Bool => "true or false".into(),
        Kind::List => "a list of strings (comma-separated outside the file)".into(),
        Kind::Enum(words) => {
            let quoted: Vec<String> = words.iter().map(|w| format!("\"{w}\"")).collect();
            format!("one of {}", quoted.join(", "))
        }
    }
}

fn bad(key: &str, kind: Kind, shown: &str, origin: &str) -> ConfigError {
    let shown = if kind == Kind::Secret {
        "a value (not shown: it is a secret)"
    } else {
        shown
    };
    ConfigError::new(format!(
        "{key}{origin}: expected {}, got {shown}",
        expected(kind)
    ))
}

/// Converts a string from the environment or a flag. `None`: unset the key.
pub(crate) fn from_text(
    key: &str,
    kind: Kind,
    text: &str,
    origin: &str,
) -> Result<Option<Value>, ConfigError> {
    let shown = format!("{text:?}");
    let fail = || bad(key, kind, &shown, origin);
    let word = text.trim();
    let value = match kind {
        Kind::Str => Value::String(text.to_string()),
        Kind::OptStr | Kind::Secret if text.is_empty() => return Ok(None),
        Kind::OptStr | Kind::Secret => Value::String(text.to_string()),
        Kind::UInt => Value::Integer(
            word.parse::<u64>()
                .ok()
                .and_then(|n| i64::try_from(n).ok())
                .ok_or_else(fail)?,
        ),
        Kind::Int => Value::Integer(word.parse::<i64>().map_err(|_| fail())?),
        Kind::Float => Value::Float(
            word.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .ok_or_else(fail)?,
        ),
        Kind::Bool => match word.to_ascii_lowercase().as_str() {
            "true" => Value::Boolean(true),
            "false" => Value::Boolean(false),
            _ => return Err(fail()),
        },
        Kind::List => Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_string()))
                .collect(),
        ),
        Kind::Enum(words) => Value::String(enum_word(words, word).ok_or_else(fail)?),
    };
    Ok(Some(value))
}

/// Checks a value from the TOML file. `None`: unset the key.
pub(crate) fn from_toml(
    key: &str,
    kind: Kind,
    value: Value,
    origin: &str,
) -> Result<Option<Value>, ConfigError> {
    let shown = match &value {
        Value::String(s) => format!("the string {s:?}"),
        Value::Integer(n) => format!("the integer {n}"),
        Value::Float(f) => format!("the float {f}"),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Datetime(d) => format!("the datetime {d} (quote it to make it a string)"),
        Value::Array(_) => "an array".into(),
        Value::Table(_) => "a table".into(),
    };
    let fail = || bad(key, kind, &shown, origin);
    let ok = match (kind, value) {
        (Kind::Str, v @ Value::String(_)) => v,
        (Kind::OptStr | Kind::Secret, Value::String(s)) if s.is_empty() => return Ok(None),
        (Kind::OptStr | Kind::Secret, v @ Value::String(_)) => v,
        (Kind::UInt, Value::Integer(n)) if n >= 0 => Value::Integer(n),
        (Kind::Int, v @ Value::Integer(_)) => v,
        (Kind::Float, Value::Float(f)) if f.is_finite() => Value::Float(f),
        (Kind::Float, Value::Integer(n)) => Value::Float(n as f64),
        (Kind::Bool, v @ Value::Boolean(_)) => v,
        (Kind::List, Value::Array(items)) => {
            let strings: Option<Vec<Value>> =
                items.into_iter().map(|v| v.is_str().then_some(v)).collect();
            Value::Array(strings.ok_or_else(fail)?)
        }
        (Kind::List, Value::String(s)) => return from_text(key, kind, &s, origin),
        (Kind::Enum(words), Value::String(s)) => {
            Value::String(enum_word(words, &s).ok_or_else(fail)?)
        }
        _ => return Err(fail()),
    };
    Ok(Some(ok))
}

fn enum_word(words: &[&str], text: &str) -> Option<String> {
    words
        .iter()
        .find(|w| w.eq_ignore_ascii_case(text.trim()))
        .map(|w| w.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_are_suggested() {
        let cases = [
            ("nats.urls", Some("nats.url")),
            ("lease_ttl", Some("lease_ttl_secs")),
            ("subjects.gen_jobs", Some("subjects.gen")),
            ("jetstream.ackwait_secs", Some("jetstream.ack_wait_secs")),
            ("completely.different", None),
        ];
        for (key, want) in cases {
            assert_eq!(nearest(key), want, "{key}");
        }
    }

    /// A key missing from the table could not be set; a key in the table
    /// without a field would be refused by the struct.
    #[test]
    fn the_key_table_and_the_struct_agree() {
        let mut c = crate::config::Config::default();
        c.nats.user = Some("u".into());
        c.nats.password = Some("p".into());
        c.nats.token = Some("t".into());
        c.nats.credentials_file = Some("/c".into());
        c.etcd.user = Some("u".into());
        c.etcd.password = Some("p".into());
        c.nats.nkey_seed_file = Some("/n".into());
        c.nats.tls.ca_file = Some("/ca".into());
        c.nats.tls.cert_file = Some("/c".into());
        c.nats.tls.key_file = Some("/k".into());
        c.etcd.tls.ca_file = Some("/ca".into());
        c.etcd.tls.cert_file = Some("/c".into());
        c.etcd.tls.key_file = Some("/k".into());
        c.otel.endpoint = Some("http://collector:4317".into());
        c.otel.protocol = Some("grpc".into());
        let Value::Table(root) = Value::try_from(&c).unwrap() else {
            panic!("a config serializes to a table");
        };
        fn walk(prefix: &str, table: toml::Table, found: &mut Vec<String>) {
            for (key, value) in table {
                let full = if prefix.is_empty() {
                    key
                } else {
                    format!("{prefix}.{key}")
                };
                match value {
                    Value::Table(inner) => walk(&full, inner, found),
                    _ => found.push(full),
                }
            }
        }
        let mut found = Vec::new();
        walk("", root, &mut found);
        let mut known: Vec<String> = KEYS.iter().map(|k| k.name.to_string()).collect();
        found.sort();
        known.sort();
        assert_eq!(found, known);
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name("nats.url"), "HANDOFF_NATS__URL");
        assert_eq!(env_name("lease_ttl_secs"), "HANDOFF_LEASE_TTL_SECS");
        assert_eq!(
            env_name("jetstream.ack_wait_secs"),
            "HANDOFF_JETSTREAM__ACK_WAIT_SECS"
        );
    }
}
