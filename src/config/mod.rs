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
//! - `sections`: the struct of each table (`[nats]`, `[jetstream]`, ...).
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
mod sections;
pub mod subject;
mod table;
mod validate;

pub use keys::env_name;
pub use redact::redact_urls;
pub use reference::reference_markdown;
pub use sections::{
    CancelConfig, DeadlineConfig, EtcdConfig, EtcdTls, IdServiceConfig, JetStreamConfig,
    KvHoldConfig, MissingDisaggRequestId, NatsConfig, NatsTls, OtelConfig, Subjects, TrtllmConfig,
};
pub use table::{Key, Kind, Range};

use crate::ids::IdLayout;
use serde::{Deserialize, Serialize};

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
    pub deadline: DeadlineConfig,
    pub trtllm: TrtllmConfig,
    pub kv_hold_ms: KvHoldConfig,
    pub cancel: CancelConfig,
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
            deadline: DeadlineConfig::default(),
            trtllm: TrtllmConfig::default(),
            kv_hold_ms: KvHoldConfig::default(),
            cancel: CancelConfig::default(),
            allowed_reply_subjects: Vec::new(),
            lease_ttl_secs: 10,
            id_layout: IdLayout::Rc22,
            id_epoch: "2025-01-01T00:00:00Z".into(),
            max_payload_bytes: 1024 * 1024,
            max_in_flight: 1024,
            max_in_flight_bytes: 8 * 1024 * 1024,
            log_format: "text".into(),
            otel: OtelConfig::default(),
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
        table::KEYS.iter().map(|k| k.name)
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
        fill(&mut self.subjects.cancel, format!("{ns}.handoff.cancel"));
        fill(&mut self.subjects.kv_release, format!("{ns}.kv.release"));
        fill(&mut self.queue_group, format!("{ns}-handoff"));
        let upper = ns.to_uppercase();
        fill(
            &mut self.jetstream.prefill_stream,
            format!("{upper}_PREFILL"),
        );
        fill(&mut self.jetstream.gen_stream, format!("{upper}_GEN"));
        fill(&mut self.jetstream.cancel_stream, format!("{upper}_CANCEL"));
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
        own.push(self.subjects.cancel.clone());
        own.push(self.subjects.kv_release.clone());
        own
    }

    /// `id_epoch` in Unix milliseconds.
    pub fn epoch_unix_ms(&self) -> Result<u64, ConfigError> {
        epoch::parse_utc_ms(&self.id_epoch)
            .map_err(|why| validate::epoch_error(&self.id_epoch, &why))
    }
}
