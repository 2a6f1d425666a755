//! The checks that types alone cannot make. Each error names its key, says
//! what was wrong and what is expected, and never shows a secret.

use super::redact::redact_urls;
use super::{Config, ConfigError, epoch};
use crate::decision::reply::matches;
use std::net::SocketAddr;

const MAX_CLOCK_SKEW_MS: u64 = 3_600_000;
const MAX_CANCEL_ENTRIES: u64 = 10_000_000;
const MAX_CANCEL_RETENTION_SECS: u64 = 86_400;

fn err(key: &str, message: impl std::fmt::Display) -> ConfigError {
    ConfigError(format!("{key}: {message}"))
}

/// Checks a resolved configuration (namespace-derived names filled in).
pub(super) fn check(c: &Config) -> Result<(), ConfigError> {
    namespace(&c.namespace)?;
    subjects(c)?;
    names(c)?;
    addresses(c)?;
    auth(c)?;
    secure_transport(c)?;
    limits(c)?;
    jetstream(c)?;
    id_epoch(c)?;
    otel(c)?;
    for (key, value, allowed) in [
        ("log_format", c.log_format.as_str(), &["text", "json"]),
        (
            "jetstream.storage",
            c.jetstream.storage.as_str(),
            &["file", "memory"],
        ),
    ] {
        if !allowed.contains(&value) {
            return Err(err(
                key,
                format!("{value:?} is not one of \"{}\"", allowed.join("\", \"")),
            ));
        }
    }
    Ok(())
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

/// A token of a NATS subject: non-empty, no whitespace or control characters.
fn is_token(t: &str) -> bool {
    !t.is_empty() && t.bytes().all(|b| b > b' ' && b != 0x7f)
}

/// A subject one can subscribe to: `*` for one token, a final `>` for the rest.
fn is_pattern(s: &str) -> bool {
    let tokens: Vec<&str> = s.split('.').collect();
    tokens
        .iter()
        .enumerate()
        .all(|(i, t)| is_token(t) && (*t != ">" || i + 1 == tokens.len()))
}

/// A subject one can publish to: a pattern without wildcards.
fn is_literal(s: &str) -> bool {
    is_pattern(s) && s.split('.').all(|t| t != "*" && t != ">")
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
        ("subjects.cancel", &c.subjects.cancel),
        ("subjects.kv_release", &c.subjects.kv_release),
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
        ("jetstream.cancel_stream", &c.jetstream.cancel_stream),
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
    let streams = [&c.jetstream.prefill_stream, &c.jetstream.gen_stream];
    if streams.contains(&&c.jetstream.cancel_stream) {
        return Err(err(
            "jetstream.cancel_stream",
            "is the same stream as jetstream.prefill_stream or jetstream.gen_stream; cancels need a stream of their own",
        ));
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
    if let Some(path) = &n.credentials_file
        && !path.is_file()
    {
        return Err(err(
            "nats.credentials_file",
            format!("{} is not a readable file", path.display()),
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

/// TLS files and the NKey seed: read and parsed now, so a file that cannot
/// work stops the program before it touches the network.
fn secure_transport(c: &Config) -> Result<(), ConfigError> {
    use crate::security::{TlsFiles, nkey, pem::Material};
    let fail = |e: crate::security::SecurityError| ConfigError(e.to_string());
    if let Some(path) = &c.nats.nkey_seed_file {
        nkey::read_seed(path).map_err(fail)?;
    }
    Material::load(TlsFiles::nats(&c.nats)).map_err(fail)?;
    Material::load(TlsFiles::etcd(&c.etcd)).map_err(fail)?;
    if c.nats.tls.first && c.nats.url.split(',').any(|u| u.trim().starts_with("ws")) {
        return Err(err(
            "nats.tls.first",
            "applies to nats:// and tls:// URLs only; a websocket URL negotiates TLS itself",
        ));
    }
    // etcd-client refuses TLS options with an http:// endpoint, and a
    // certificate sent over plaintext would be pointless.
    let etcd = &c.etcd;
    let plain: Vec<&str> = etcd
        .endpoints
        .split(',')
        .map(str::trim)
        .filter(|e| e.to_ascii_lowercase().starts_with("http://"))
        .collect();
    if etcd.tls_enabled()
        && let Some(first) = plain.first()
    {
        return Err(err(
            "etcd.endpoints",
            format!(
                "{:?} is http:// while etcd TLS is in use (an https:// endpoint or an etcd.tls.* file); use https:// for every endpoint",
                redact_urls(first)
            ),
        ));
    }
    Ok(())
}

fn limits(c: &Config) -> Result<(), ConfigError> {
    if c.lease_ttl_secs < 2 {
        return Err(err(
            "lease_ttl_secs",
            format!(
                "{} is too short; expected at least 2: the lease is renewed every TTL/3, and etcd \
                 itself never grants less than about 2 s (it would silently extend a shorter lease, \
                 and the worker would fence its slot while etcd still holds it)",
                c.lease_ttl_secs
            ),
        ));
    }
    let at_least = [
        (
            "shutdown_timeout_secs",
            c.shutdown_timeout_secs,
            1,
            "0 would abandon in-flight results without an output",
        ),
        (
            "max_payload_bytes",
            c.max_payload_bytes as u64,
            1024,
            "a prefill result with its frames and handoff parameters needs at least 1 KiB",
        ),
        (
            "max_in_flight",
            c.max_in_flight as u64,
            1,
            "at least one result must be processed at a time",
        ),
        (
            "nats.subscription_capacity",
            c.nats.subscription_capacity as u64,
            1,
            "the client needs room for at least one message",
        ),
        (
            "nats.connect_timeout_secs",
            c.nats.connect_timeout_secs,
            1,
            "0 would give up on NATS before trying",
        ),
        (
            "etcd.connect_timeout_ms",
            c.etcd.connect_timeout_ms,
            1,
            "0 would never wait for etcd",
        ),
        (
            "id_service.ids_per_sec",
            c.id_service.ids_per_sec,
            1,
            "0 would refuse every ID request",
        ),
        (
            "id_service.max_count",
            c.id_service.max_count,
            1,
            "a request asks for at least one ID",
        ),
        (
            "etcd.request_timeout_ms",
            c.etcd.request_timeout_ms,
            1,
            "0 would never wait for etcd",
        ),
        (
            "cancel.max_entries",
            c.cancel.max_entries,
            1,
            "0 would forget every cancel at once",
        ),
        (
            "cancel.max_bytes",
            c.cancel.max_bytes,
            1024,
            "a cancel of a 256-byte request ID with its bookkeeping needs about 400 bytes",
        ),
        (
            "cancel.retention_secs",
            c.cancel.retention_secs,
            1,
            "0 would forget every cancel at once",
        ),
    ];
    for (key, value, min, why) in at_least {
        if value < min {
            return Err(err(
                key,
                format!("{value} is too small; expected at least {min}: {why}"),
            ));
        }
    }
    let at_most = [
        (
            "id_service.max_count",
            c.id_service.max_count,
            crate::id_service::MAX_COUNT,
            "the contract's largest request",
        ),
        (
            "id_service.ids_per_sec",
            c.id_service.ids_per_sec,
            MAX_ID_SERVICE_RATE,
            "half of what a slot mints in rc22 (1,024 IDs per millisecond), so decode jobs always keep the other half",
        ),
        (
            "deadline.clock_skew_ms",
            c.deadline.clock_skew_ms,
            MAX_CLOCK_SKEW_MS,
            "an hour; clocks further apart than that need fixing, not tolerating",
        ),
        (
            "cancel.max_entries",
            c.cancel.max_entries,
            MAX_CANCEL_ENTRIES,
            "ten million",
        ),
        (
            "cancel.retention_secs",
            c.cancel.retention_secs,
            MAX_CANCEL_RETENTION_SECS,
            "a day; a request waits for its handoff seconds, not days",
        ),
    ];
    for (key, value, max, why) in at_most {
        if value > max {
            return Err(err(
                key,
                format!("{value} is too large; expected at most {max}: {why}"),
            ));
        }
    }
    in_flight_bytes(c)
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
    if bytes > u32::MAX as usize {
        return Err(err(
            "max_in_flight_bytes",
            format!(
                "{bytes} is too large; expected at most {} (4 GiB - 1)",
                u32::MAX
            ),
        ));
    }
    Ok(())
}

/// The ID service's largest budget: half a slot's rc22 rate (rc21 mints four
/// times as many per millisecond, so half of rc22 is an eighth there).
const MAX_ID_SERVICE_RATE: u64 = 512_000;

fn jetstream(c: &Config) -> Result<(), ConfigError> {
    let js = &c.jetstream;
    let at_least = [
        ("jetstream.ack_wait_secs", js.ack_wait_secs, 1),
        (
            "jetstream.duplicate_window_secs",
            js.duplicate_window_secs,
            1,
        ),
        ("jetstream.batch", js.batch as u64, 1),
    ];
    for (key, value, min) in at_least {
        if value < min {
            return Err(err(
                key,
                format!("{value} is too small; expected at least {min}"),
            ));
        }
    }
    for (key, value) in [
        ("jetstream.max_deliver", js.max_deliver),
        ("jetstream.max_ack_pending", js.max_ack_pending),
        ("jetstream.max_bytes", js.max_bytes),
    ] {
        if value == 0 || value < -1 {
            return Err(err(
                key,
                format!("{value} is not allowed; expected -1 (unlimited) or a positive integer"),
            ));
        }
    }
    if !(1..=5).contains(&js.replicas) {
        return Err(err(
            "jetstream.replicas",
            format!(
                "{} is not allowed; expected 1 to 5 (NATS keeps at most 5 replicas of a stream; 3 survives the loss of one server)",
                js.replicas
            ),
        ));
    }
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

/// `otel.*`: a URL the exporter can use, a known protocol, a ratio, bounds.
fn otel(c: &Config) -> Result<(), ConfigError> {
    let o = &c.otel;
    if let Some(endpoint) = &o.endpoint
        && !crate::telemetry::is_collector_url(endpoint)
    {
        return Err(err(
            "otel.endpoint",
            format!(
                "{:?} is not a collector URL; expected http://host:port \
                     (e.g. http://127.0.0.1:4317 for OTLP/gRPC, http://127.0.0.1:4318 for OTLP/HTTP; \
                     TLS to the collector is not supported: use a collector agent on the node)",
                redact_urls(endpoint)
            ),
        ));
    }
    if let Some(protocol) = &o.protocol
        && crate::telemetry::Protocol::parse(protocol).is_none()
    {
        return Err(err(
            "otel.protocol",
            format!("{protocol:?} is not one of \"grpc\", \"http\" (\"http/protobuf\")"),
        ));
    }
    if !(0.0..=1.0).contains(&o.sampling_ratio) {
        return Err(err(
            "otel.sampling_ratio",
            format!(
                "{} is not a share; expected a number from 0 (no new traces) to 1 (all)",
                o.sampling_ratio
            ),
        ));
    }
    if !(1..=1_000_000).contains(&o.queue_spans) {
        return Err(err(
            "otel.queue_spans",
            format!(
                "{} is out of range; expected 1 to 1000000 (each waiting span holds about 1 KiB)",
                o.queue_spans
            ),
        ));
    }
    if o.export_timeout_ms == 0 {
        return Err(err("otel.export_timeout_ms", "expected at least 1"));
    }
    Ok(())
}

pub(super) fn epoch_error(text: &str, why: &epoch::EpochError) -> ConfigError {
    err(
        "id_epoch",
        format!("{text:?} is not an RFC 3339 UTC instant like 2025-01-01T00:00:00Z: {why}"),
    )
}
