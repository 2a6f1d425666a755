//! The checks that types alone cannot make: each key's range (from the key
//! table), the syntax of names, subjects and addresses, and the rules that
//! tie keys together. What a section means to the subsystem it configures
//! (TLS files, the OTLP exporter, the JetStream objects) is checked by that
//! subsystem's `from_config`. Each error names its key, says what was wrong
//! and what is expected, and never shows a secret.

use super::redact::redact_urls;
use super::subject::{is_literal, is_pattern, is_token, matches};
use super::table::{KEYS, Key, Kind, Range};
use super::{Config, ConfigError, epoch};
use serde_json::Value as Json;
use std::net::SocketAddr;

fn err(key: &str, message: impl std::fmt::Display) -> ConfigError {
    ConfigError::new(format!("{key}: {message}"))
}

/// Checks a resolved configuration (namespace-derived names filled in).
pub(super) fn check(c: &Config) -> Result<(), ConfigError> {
    ranges(c)?;
    namespace(&c.namespace)?;
    subjects(c)?;
    names(c)?;
    addresses(c)?;
    auth(c)?;
    in_flight_bytes(c)?;
    duplicate_window(c)?;
    id_epoch(c)
}

/// Every key's value against its kind's words and its range in the table.
/// The struct is read through its serialized form, so a key is found by its
/// dotted name, as the table names it.
fn ranges(c: &Config) -> Result<(), ConfigError> {
    let root =
        serde_json::to_value(c).map_err(|e| ConfigError::new(format!("configuration: {e}")))?;
    for key in KEYS {
        let value = key.name.split('.').try_fold(&root, |v, part| v.get(part));
        if let Some(value) = value {
            in_range(key, value)?;
        }
    }
    Ok(())
}

fn in_range(key: &Key, value: &Json) -> Result<(), ConfigError> {
    let because = |text: String| match key.why {
        "" => text,
        why => format!("{text}: {why}"),
    };
    if let (Kind::Enum(words), Some(word)) = (key.kind, value.as_str())
        && !words.contains(&word)
    {
        return Err(err(
            key.name,
            format!("{word:?} is not one of \"{}\"", words.join("\", \"")),
        ));
    }
    match key.range {
        Range::Any => Ok(()),
        Range::AtLeast(min) => match value.as_u64() {
            Some(n) if n < min => Err(err(
                key.name,
                because(format!("{n} is too small; expected at least {min}")),
            )),
            _ => Ok(()),
        },
        Range::Between(min, max) => match value.as_u64() {
            Some(n) if !(min..=max).contains(&n) => Err(err(
                key.name,
                because(format!("{n} is out of range; expected {min} to {max}")),
            )),
            _ => Ok(()),
        },
        Range::MinusOneOrPositive => match value.as_i64() {
            Some(n) if n == 0 || n < -1 => Err(err(
                key.name,
                because(format!(
                    "{n} is not allowed; expected -1 (unlimited) or a positive integer"
                )),
            )),
            _ => Ok(()),
        },
        Range::Fraction => match value.as_f64() {
            Some(f) if !(0.0..=1.0).contains(&f) => Err(err(
                key.name,
                because(format!("{f} is not a share; expected a number from 0 to 1")),
            )),
            _ => Ok(()),
        },
    }
}

fn namespace(ns: &str) -> Result<(), ConfigError> {
    let ok = !ns.is_empty()
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(err(
            "namespace",
            format!(
                "{ns:?} cannot be used; expected a non-empty word of letters, digits, '_' or '-', \
                 because it becomes a NATS subject token, part of the JetStream stream names \
                 ({{NS}}_PREFILL, {{NS}}_GEN) and of the etcd keys (/{{ns}}/handoff/...)"
            ),
        ))
    }
}

fn subjects(c: &Config) -> Result<(), ConfigError> {
    let prefill = c.prefill_subjects();
    if prefill.is_empty() {
        return Err(err(
            "subjects.prefill_results",
            "no subject given; expected one or more comma-separated NATS subjects (wildcards allowed)",
        ));
    }
    for p in &prefill {
        if !is_pattern(p) {
            return Err(err(
                "subjects.prefill_results",
                format!(
                    "{p:?} is not a valid NATS subject (empty token, whitespace, or '>' not last)"
                ),
            ));
        }
    }
    let outputs = [
        ("subjects.gen", &c.subjects.gen_jobs),
        ("subjects.dead_letter", &c.subjects.dead_letter),
        ("subjects.ids", &c.subjects.ids),
    ];
    for (i, (key, subject)) in outputs.iter().enumerate() {
        if !is_literal(subject) {
            return Err(err(
                key,
                format!(
                    "{subject:?} is not a literal NATS subject; expected dot-separated tokens without wildcards or whitespace"
                ),
            ));
        }
        if let Some(p) = prefill.iter().find(|p| matches(p, subject)) {
            return Err(err(
                key,
                format!(
                    "{subject:?} matches the prefill subject {p:?}; the worker would consume its own output"
                ),
            ));
        }
        if let Some((other, _)) = outputs[..i].iter().find(|(_, s)| s == subject) {
            return Err(err(
                key,
                format!("{subject:?} is also {other}; each output needs its own subject"),
            ));
        }
    }
    for p in &c.allowed_reply_subjects {
        if !is_pattern(p) {
            return Err(err(
                "allowed_reply_subjects",
                format!("{p:?} is not a valid NATS subject pattern"),
            ));
        }
    }
    Ok(())
}

/// Queue group, stream and consumer names.
fn names(c: &Config) -> Result<(), ConfigError> {
    if !is_token(&c.queue_group) {
        return Err(err(
            "queue_group",
            format!(
                "{:?} is not a queue group name; expected a non-empty name without whitespace",
                c.queue_group
            ),
        ));
    }
    // JetStream names become file and subject parts on the server.
    let js_name = |s: &str| {
        is_token(s)
            && !s
                .bytes()
                .any(|b| matches!(b, b'.' | b'*' | b'>' | b'/' | b'\\'))
    };
    for (key, value) in [
        ("jetstream.prefill_stream", &c.jetstream.prefill_stream),
        ("jetstream.gen_stream", &c.jetstream.gen_stream),
        ("jetstream.consumer", &c.jetstream.consumer),
    ] {
        if !js_name(value) {
            return Err(err(
                key,
                format!(
                    "{value:?} is not a JetStream name; expected a non-empty name without whitespace, '.', '*', '>', '/' or '\\'"
                ),
            ));
        }
    }
    if c.jetstream.prefill_stream == c.jetstream.gen_stream {
        return Err(err(
            "jetstream.gen_stream",
            "is the same stream as jetstream.prefill_stream; prefill results and decode jobs need separate streams",
        ));
    }
    Ok(())
}

fn addresses(c: &Config) -> Result<(), ConfigError> {
    if c.metrics_addr.parse::<SocketAddr>().is_err() {
        return Err(err(
            "metrics_addr",
            format!(
                "{:?} is not a socket address; expected IP:PORT, e.g. 127.0.0.1:9464 or [::]:9464",
                c.metrics_addr
            ),
        ));
    }
    for (key, list, example) in [
        ("nats.url", &c.nats.url, "nats://127.0.0.1:4222"),
        ("etcd.endpoints", &c.etcd.endpoints, "http://127.0.0.1:2379"),
    ] {
        let entries: Vec<&str> = list.split(',').map(str::trim).collect();
        if entries.iter().any(|e| !is_token(e)) {
            return Err(err(
                key,
                format!(
                    "{:?} is not a comma-separated list of addresses; expected e.g. {example}",
                    redact_urls(list)
                ),
            ));
        }
    }
    Ok(())
}

fn auth(c: &Config) -> Result<(), ConfigError> {
    let n = &c.nats;
    match (&n.user, &n.password) {
        (Some(_), None) => {
            return Err(err(
                "nats.password",
                "not set, but nats.user is; NATS user authentication needs both",
            ));
        }
        (None, Some(_)) => {
            return Err(err(
                "nats.user",
                "not set, but nats.password is; NATS user authentication needs both",
            ));
        }
        _ => {}
    }
    let methods: Vec<(&str, &str)> = [
        n.user
            .as_ref()
            .map(|_| ("nats.user", "nats.user/nats.password")),
        n.token.as_ref().map(|_| ("nats.token", "nats.token")),
        n.credentials_file
            .as_ref()
            .map(|_| ("nats.credentials_file", "nats.credentials_file")),
        n.nkey_seed_file
            .as_ref()
            .map(|_| ("nats.nkey_seed_file", "nats.nkey_seed_file")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let [(_, first), (key, _), ..] = methods[..] {
        return Err(err(
            key,
            format!("set together with {first}; choose one NATS authentication method"),
        ));
    }
    // Credentials written in the URL are one more method (nats_url.rs).
    if super::nats_url::parse(&n.url)?.credentials.is_some()
        && let [(_, other), ..] = methods[..]
    {
        return Err(err(
            "nats.url",
            format!(
                "holds credentials (user:password@ or token@) while {other} is set too; choose one NATS authentication method"
            ),
        ));
    }
    match (&c.etcd.user, &c.etcd.password) {
        (Some(_), None) => Err(err(
            "etcd.password",
            "not set, but etcd.user is; etcd authentication needs both",
        )),
        (None, Some(_)) => Err(err(
            "etcd.user",
            "not set, but etcd.password is; etcd authentication needs both",
        )),
        _ => Ok(()),
    }
}

fn in_flight_bytes(c: &Config) -> Result<(), ConfigError> {
    let bytes = c.max_in_flight_bytes;
    if bytes < c.max_payload_bytes {
        return Err(err(
            "max_in_flight_bytes",
            format!(
                "{bytes} is smaller than max_payload_bytes ({}); expected at least that, or the largest accepted result could never be taken",
                c.max_payload_bytes
            ),
        ));
    }
    Ok(())
}

/// NATS refuses a duplicate window longer than the stream's max age. (The
/// window `setup` actually uses can be longer still: `crate::setup` checks
/// that one.)
fn duplicate_window(c: &Config) -> Result<(), ConfigError> {
    let js = &c.jetstream;
    if js.max_age_secs > 0 && js.duplicate_window_secs > js.max_age_secs {
        return Err(err(
            "jetstream.duplicate_window_secs",
            format!(
                "{} is longer than jetstream.max_age_secs ({}); NATS refuses a duplicate window longer than the stream's max age",
                js.duplicate_window_secs, js.max_age_secs
            ),
        ));
    }
    Ok(())
}

fn id_epoch(c: &Config) -> Result<(), ConfigError> {
    let ms = epoch::parse_utc_ms(&c.id_epoch).map_err(|why| epoch_error(&c.id_epoch, &why))?;
    if ms > crate::clock::unix_ms() {
        return Err(err(
            "id_epoch",
            format!(
                "{:?} is in the future; request IDs count milliseconds since id_epoch, so it must be in the past",
                c.id_epoch
            ),
        ));
    }
    Ok(())
}

pub(super) fn epoch_error(text: &str, why: &epoch::EpochError) -> ConfigError {
    err(
        "id_epoch",
        format!("{text:?} is not an RFC 3339 UTC instant like 2025-01-01T00:00:00Z: {why}"),
    )
}
