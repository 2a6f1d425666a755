//! Configuration: defaults, then the TOML file (`--config`), then `HANDOFF_*`
//! environment variables, then command-line flags (contract 2).
//!
//! This module holds the merged values and their syntax and range checks,
//! and imports nothing of the crate above `ids`: what a section means to the
//! subsystem it configures is checked there, by `security::TlsSettings`,
//! `telemetry::Settings`, `decision::Rules`, `setup::Wanted` and
//! `id_service::IdService` (`from_config` each, called once at load by the
//! CLI, `cli::load`). Every key is in the key table, which also generates
//! the reference, `docs/configuration.md`; `config/handoff.toml` is the
//! annotated example.
//!
//! - `table`: every key: kind, range, meaning.
//! - `keys`: what a kind and a range are, and converting values by kind.
//! - `load`: the layers (file, environment, flags) over that table.
//! - `validate`: the checks `resolve()` makes after the names are derived.
//! - `reference`: the table as Markdown.
//! - [`subject`]: NATS subject syntax.
//! - `epoch`: the RFC 3339 parser for `id_epoch`.
//! - `nats_url`: `nats.url` as server addresses and the credentials in it.
//! - `redact`: `Debug` without secrets.

mod epoch;
mod keys;
mod load;
pub mod nats_url;
mod redact;
mod reference;
pub mod subject;
mod table;
mod validate;

pub use keys::{Key, Kind, Range, env_name};
pub use redact::redact_urls;
pub use reference::reference_markdown;

use crate::ids::IdLayout;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The whole configuration, after defaults and overrides are applied and the
/// namespace-derived names are filled in.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub nats: NatsConfig,
    pub etcd: EtcdConfig,
    pub mode: Mode,
    /// Address of the metrics and health HTTP server.
    pub metrics_addr: String,
    pub shutdown_timeout_secs: u64,
    pub namespace: String,
    pub subjects: Subjects,
    /// Queue group in core mode; empty means `{ns}-handoff`.
    pub queue_group: String,
    pub jetstream: JetStreamConfig,
    pub id_service: IdServiceConfig,
    pub allowed_reply_subjects: Vec<String>,
    pub lease_ttl_secs: u64,
    pub id_layout: IdLayout,
    /// RFC 3339 UTC instant IDs count milliseconds from.
    pub id_epoch: String,
    pub max_payload_bytes: usize,
    /// Results processed concurrently by one worker.
    pub max_in_flight: usize,
    /// Bytes of prefill results one worker holds at once: taken from NATS and
    /// not yet answered (waiting, being decided, being published).
    pub max_in_flight_bytes: usize,
    /// `text` or `json` log lines.
    pub log_format: String,
    pub otel: OtelConfig,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Core,
    Jetstream,
}

/// `Debug` hides the password, the token and URL credentials.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// Comma-separated server URLs.
    pub url: String,
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    pub credentials_file: Option<PathBuf>,
    /// Client name shown in the server's connection list.
    pub name: String,
    /// Messages the client buffers per subscription while the worker is
    /// behind; beyond it, core NATS drops them (slow consumer).
    pub subscription_capacity: usize,
    /// Bytes the client buffers for all subscriptions together; at this
    /// bound it stops reading, and the server holds what follows (up to its
    /// `max_pending`).
    pub subscription_bytes: usize,
    /// `run` exits 1 when no server of `url` answers within this at start.
    pub connect_timeout_secs: u64,
    /// File holding an NKey user seed (`SU...`).
    pub nkey_seed_file: Option<PathBuf>,
    pub tls: NatsTls,
}

/// TLS to NATS. Every file is read and checked at start (`crate::security`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct NatsTls {
    /// PEM CA bundle that signs the server's certificate, instead of the
    /// system roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; with `key_file`.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Never talk to the server without TLS. In effect also when a TLS file
    /// is set or a URL is `tls://` ([`NatsConfig::tls_required`]).
    pub required: bool,
    /// TLS before the server's INFO (servers with `handshake_first`, 2.10+).
    pub first: bool,
}

/// TLS to etcd (`https://` endpoints).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct EtcdTls {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl NatsConfig {
    /// Whether the connection must be TLS: asked for, implied by a TLS file
    /// or `nats.tls.first`, or by a `tls://` URL. A CA or a client
    /// certificate is pointless over a connection that may stay plaintext,
    /// so `required = false` cannot switch it off.
    pub fn tls_required(&self) -> bool {
        let t = &self.tls;
        t.required
            || t.first
            || t.ca_file.is_some()
            || t.cert_file.is_some()
            || t.key_file.is_some()
            || self
                .url
                .split(',')
                .any(|u| u.trim().to_ascii_lowercase().starts_with("tls://"))
    }
}

impl EtcdConfig {
    /// Whether the endpoints are reached over TLS: any `https://` endpoint
    /// or any etcd TLS file.
    pub fn tls_enabled(&self) -> bool {
        let t = &self.tls;
        t.ca_file.is_some()
            || t.cert_file.is_some()
            || t.key_file.is_some()
            || self
                .endpoints
                .split(',')
                .any(|e| e.trim().to_ascii_lowercase().starts_with("https://"))
    }
}

/// `Debug` hides the password and URL credentials.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EtcdConfig {
    /// Comma-separated endpoints.
    pub endpoints: String,
    pub user: Option<String>,
    pub password: Option<String>,
    pub connect_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub tls: EtcdTls,
}

/// Subject names; empty means the namespace-derived default.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Subjects {
    pub prefill_results: String,
    #[serde(rename = "gen")]
    pub gen_jobs: String,
    pub dead_letter: String,
    pub ids: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JetStreamConfig {
    /// Empty means `{NS}_PREFILL`.
    pub prefill_stream: String,
    /// Empty means `{NS}_GEN`.
    pub gen_stream: String,
    pub consumer: String,
    /// `run --mode jetstream` creates missing streams and consumer.
    pub create: bool,
    /// Whether decode jobs are published into the GEN stream (waiting for its ack).
    pub gen_is_stream: bool,
    pub ack_wait_secs: u64,
    pub max_deliver: i64,
    /// Deliveries outstanding (not yet acked) across all workers at once;
    /// -1 for no limit.
    pub max_ack_pending: i64,
    pub nak_delay_ms: u64,
    pub duplicate_window_secs: u64,
    pub max_age_secs: u64,
    pub max_bytes: i64,
    /// `file` or `memory`.
    pub storage: String,
    pub batch: usize,
    /// Replicas of both streams (1–5): 3 survives the loss of one server
    /// of a NATS cluster.
    pub replicas: usize,
}

/// OpenTelemetry traces exported over OTLP (`crate::telemetry`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OtelConfig {
    /// The OTLP collector, `http://host:port`. Unset: the standard
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// and with neither no tracing at all.
    pub endpoint: Option<String>,
    /// `grpc` or `http` (OTLP/HTTP with protobuf). Unset: the standard
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, else `grpc`.
    pub protocol: Option<String>,
    /// Share of new traces (results without a sampled-or-not `traceparent`)
    /// recorded, 0 to 1. A result with a `traceparent` follows its flag.
    pub sampling_ratio: f64,
    /// Finished spans waiting for export, at most; more are dropped and counted.
    pub queue_spans: usize,
    /// Longest one export may take before its spans are dropped.
    pub export_timeout_ms: u64,
}

impl Default for OtelConfig {
    fn default() -> Self {
        OtelConfig {
            endpoint: None,
            protocol: None,
            sampling_ratio: 1.0,
            queue_spans: 2048,
            export_timeout_ms: 5000,
        }
    }
}

/// The ID mint service's own budget, apart from the decode jobs' minting.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IdServiceConfig {
    /// IDs per second the service hands out; requests beyond are refused
    /// with `rate_limited`.
    pub ids_per_sec: u64,
    /// The most IDs one request may ask for (at most the contract's 1024).
    pub max_count: u64,
}

impl Default for IdServiceConfig {
    fn default() -> Self {
        IdServiceConfig {
            ids_per_sec: 100_000,
            max_count: 1024,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            nats: NatsConfig::default(),
            etcd: EtcdConfig::default(),
            mode: Mode::Core,
            metrics_addr: "127.0.0.1:9464".into(),
            shutdown_timeout_secs: 10,
            namespace: "llm".into(),
            subjects: Subjects::default(),
            queue_group: String::new(),
            jetstream: JetStreamConfig::default(),
            id_service: IdServiceConfig::default(),
            allowed_reply_subjects: Vec::new(),
            lease_ttl_secs: 10,
            id_layout: IdLayout::Rc22,
            id_epoch: "2025-01-01T00:00:00Z".into(),
            max_payload_bytes: 1024 * 1024,
            max_in_flight: 256,
            max_in_flight_bytes: 8 * 1024 * 1024,
            log_format: "text".into(),
            otel: OtelConfig::default(),
        }
    }
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: "nats://127.0.0.1:4222".into(),
            user: None,
            password: None,
            token: None,
            credentials_file: None,
            name: "prefill-handoff".into(),
            subscription_capacity: 262_144,
            subscription_bytes: 8 * 1024 * 1024,
            connect_timeout_secs: 10,
            nkey_seed_file: None,
            tls: NatsTls::default(),
        }
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: "http://127.0.0.1:2379".into(),
            user: None,
            password: None,
            connect_timeout_ms: 2000,
            request_timeout_ms: 2000,
            tls: EtcdTls::default(),
        }
    }
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        JetStreamConfig {
            prefill_stream: String::new(),
            gen_stream: String::new(),
            consumer: "handoff".into(),
            create: true,
            gen_is_stream: true,
            ack_wait_secs: 30,
            max_deliver: 20,
            max_ack_pending: 1000,
            nak_delay_ms: 1000,
            duplicate_window_secs: 120,
            max_age_secs: 24 * 3600,
            max_bytes: -1,
            storage: "file".into(),
            batch: 128,
            replicas: 1,
        }
    }
}

/// A configuration that cannot be used: exit code 2. The message names the
/// key. Made only here: a subsystem that refuses its section has an error
/// type of its own.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ConfigError {
    pub(crate) fn new(message: String) -> ConfigError {
        ConfigError(message)
    }
}

impl Config {
    /// The NATS client's bound in bytes on its subscriptions' buffers:
    /// `nats.subscription_bytes` in core mode. None in JetStream mode, whose
    /// pulls ask for at most the free part of `max_in_flight_bytes`
    /// already: there a bound would only make the acknowledgements' and
    /// publish acknowledgements' replies wait behind pulled results.
    pub fn subscription_bytes(&self) -> Option<usize> {
        match self.mode {
            Mode::Core => Some(self.nats.subscription_bytes),
            Mode::Jetstream => None,
        }
    }

    /// Loads defaults, then `file`, then `HANDOFF_*` variables from the
    /// process environment, then `overrides` (`key=value` pairs from flags),
    /// and resolves the namespace-derived names.
    pub fn load(
        file: Option<&std::path::Path>,
        overrides: &[(String, String)],
    ) -> Result<Config, ConfigError> {
        Config::load_from(file, &load::process_env()?, overrides)
    }

    /// [`Config::load`] with the environment given: `(name, value)` pairs, of
    /// which only `HANDOFF_*` count (`HANDOFF_TEST_*` is left to the test
    /// harness). A later pair for the same key wins, in every layer.
    pub fn load_from(
        file: Option<&std::path::Path>,
        env: &[(String, String)],
        overrides: &[(String, String)],
    ) -> Result<Config, ConfigError> {
        load::load(file, env, overrides)
    }

    /// Every configuration key, dotted (`nats.url`), in file order.
    pub fn keys() -> impl Iterator<Item = &'static str> {
        keys::KEYS.iter().map(|k| k.name)
    }

    /// The key table's row for a dotted key.
    pub fn key(name: &str) -> Option<&'static Key> {
        keys::lookup(name)
    }

    /// Fills every empty name with its namespace-derived default and checks
    /// the values that cannot be checked by type alone.
    pub fn resolve(mut self) -> Result<Config, ConfigError> {
        let ns = self.namespace.clone();
        let fill = |field: &mut String, default: String| {
            if field.is_empty() {
                *field = default;
            }
        };
        fill(
            &mut self.subjects.prefill_results,
            format!("{ns}.prefill.results"),
        );
        fill(&mut self.subjects.gen_jobs, format!("{ns}.gen.jobs"));
        fill(&mut self.subjects.dead_letter, format!("{ns}.handoff.dead"));
        fill(&mut self.subjects.ids, format!("{ns}.handoff.ids"));
        fill(&mut self.queue_group, format!("{ns}-handoff"));
        let upper = ns.to_uppercase();
        fill(
            &mut self.jetstream.prefill_stream,
            format!("{upper}_PREFILL"),
        );
        fill(&mut self.jetstream.gen_stream, format!("{upper}_GEN"));
        if self.allowed_reply_subjects.is_empty() {
            self.allowed_reply_subjects = vec!["_INBOX.>".into(), format!("{ns}.replies.>")];
        }
        validate::check(&self)?;
        Ok(self)
    }

    /// The prefill subjects: `subjects.prefill_results` split on commas.
    pub fn prefill_subjects(&self) -> Vec<String> {
        self.subjects
            .prefill_results
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The worker's own subjects, which replies may never target.
    pub fn own_subjects(&self) -> Vec<String> {
        let mut own = self.prefill_subjects();
        own.push(self.subjects.gen_jobs.clone());
        own.push(self.subjects.dead_letter.clone());
        own.push(self.subjects.ids.clone());
        own
    }

    /// `id_epoch` in Unix milliseconds.
    pub fn epoch_unix_ms(&self) -> Result<u64, ConfigError> {
        epoch::parse_utc_ms(&self.id_epoch)
            .map_err(|why| validate::epoch_error(&self.id_epoch, &why))
    }
}
