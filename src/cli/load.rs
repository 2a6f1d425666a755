//! Loading, for every command: the layers into a [`Config`] (its syntax and
//! range checks), then each subsystem's `from_config` for the section it
//! owns. Each is called once, here, so every refusal comes before any
//! network contact and exits 2 ([`LoadError`]).

use crate::config::{Config, ConfigError, Mode};
use crate::decision::{Rules, RulesError};
use crate::id_service::IdService;
use crate::security::{SecurityError, TlsSettings};
use crate::setup::{Wanted, WantedError};
use crate::telemetry::{self, SettingsError};

/// A configuration that cannot be used: exit code 2. Each message names the
/// key (or the standard variable) and what is expected.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Security(#[from] SecurityError),
    #[error(transparent)]
    Telemetry(#[from] SettingsError),
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error(transparent)]
    JetStream(#[from] WantedError),
    #[error("--set {pair:?}: expected KEY=VALUE, e.g. --set subjects.gen=llm.gen.jobs")]
    SetPair { pair: String },
}

/// A configuration with every section checked by its owner, and what the
/// owners made of it.
pub struct Loaded {
    pub config: Config,
    pub rules: Rules,
    /// The TLS files and NKey seed, read and checked.
    pub tls: TlsSettings,
    /// Where spans go; `None`: no tracing.
    pub otel: Option<telemetry::Settings>,
    pub id_service: IdService,
    /// The JetStream objects, when the command uses them.
    pub jetstream: Option<Wanted>,
}

/// Which sections a command needs besides the ones every command checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JetStreamObjects {
    /// In JetStream mode (`run`, `slots`).
    WhenJetStreamMode,
    /// Always (`setup`).
    Always,
}

impl Loaded {
    /// Checks every section of `config`. `env` reads the standard
    /// `OTEL_*` variables (the process environment, outside tests).
    pub fn check(
        config: Config,
        jetstream: JetStreamObjects,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Loaded, LoadError> {
        let rules = Rules::from_config(&config)?;
        let tls = TlsSettings::from_config(&config)?;
        let otel = telemetry::Settings::from_config(&config.otel, env)?;
        let wants_jetstream =
            jetstream == JetStreamObjects::Always || config.mode == Mode::Jetstream;
        let jetstream = match wants_jetstream {
            true => Some(Wanted::from_config(&config)?),
            false => None,
        };
        let id_service = IdService::from_config(&config, &rules);
        Ok(Loaded {
            config,
            rules,
            tls,
            otel,
            id_service,
            jetstream,
        })
    }
}
