//! The layers: defaults < TOML file < `HANDOFF_*` environment < flags.
//!
//! Each layer is reduced to `key → value` over the known keys of
//! [`super::keys`]; the last layer to set a key wins. Only then is the result
//! turned into a [`Config`], so a value is checked against its key once, in
//! whichever layer it came from, and the message can say where that was.

use super::keys;
use super::table::Key;
use super::{Config, ConfigError};
use std::collections::BTreeMap;
use std::path::Path;
use toml::{Table, Value};

/// Builds the configuration from the layers and resolves it.
pub(super) fn load(
    file: Option<&Path>,
    env: &[(String, String)],
    overrides: &[(String, String)],
) -> Result<Config, ConfigError> {
    let mut layers = Layers::default();
    if let Some(path) = file {
        layers.apply_file(path)?;
    }
    for (name, value) in env {
        layers.apply_env(name, value)?;
    }
    for (key, value) in overrides {
        layers.apply_flag(key, value)?;
    }
    layers.into_config()?.resolve()
}

/// The `HANDOFF_*` variables of this process.
pub(super) fn process_env() -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for (name, value) in std::env::vars_os() {
        let shown = name.to_string_lossy().into_owned();
        if !shown.starts_with("HANDOFF_") {
            continue;
        }
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => out.push((name, value)),
            _ => {
                return Err(ConfigError::new(format!(
                    "environment variable {shown}: not valid UTF-8"
                )));
            }
        }
    }
    Ok(out)
}

#[derive(Default)]
struct Layers {
    values: BTreeMap<&'static str, Value>,
}

impl Layers {
    fn set(&mut self, key: &'static str, value: Option<Value>) {
        match value {
            Some(v) => {
                self.values.insert(key, v);
            }
            None => {
                self.values.remove(key);
            }
        }
    }

    fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(format!("config file {shown}: cannot read it: {e}")))?;
        let table: Table = toml::from_str(&text).map_err(|e| {
            // The parser's own rendering quotes the offending line, which may
            // hold a password: give the position and the reason only.
            let at = e.span().map_or(String::new(), |span| {
                let before = &text.as_bytes()[..span.start.min(text.len())];
                let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
                let line_start = before
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                let column = before.len() - line_start + 1;
                format!(", line {line}, column {column}")
            });
            ConfigError::new(format!(
                "config file {shown}{at}: not valid TOML: {}",
                e.message().trim_end()
            ))
        })?;
        let origin = format!(" (in config file {shown})");
        self.apply_table("", table, &shown.to_string(), &origin)
    }

    /// The keys of one table of the file; `prefix` is the dotted path of the
    /// table (`""` at the top, `nats`, `nats.tls`, ...).
    fn apply_table(
        &mut self,
        prefix: &str,
        table: Table,
        shown: &str,
        origin: &str,
    ) -> Result<(), ConfigError> {
        for (name, value) in table {
            let key = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}.{name}")
            };
            match (keys::lookup(&key), value) {
                (Some(k), value) => {
                    self.set(k.name, keys::from_toml(k.name, k.kind, value, origin)?);
                }
                (None, Value::Table(inner)) if keys::is_section(&key) => {
                    self.apply_table(&key, inner, shown, origin)?;
                }
                (None, _) if keys::is_section(&key) => {
                    return Err(ConfigError::new(format!(
                        "{key}{origin}: expected a table of keys (`[{key}]`), got a single value"
                    )));
                }
                (None, _) => {
                    return Err(ConfigError::new(format!(
                        "config file {shown}: {}",
                        keys::unknown(&key, |k| format!("`{k}`"))
                    )));
                }
            }
        }
        Ok(())
    }

    fn apply_env(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        let Some(rest) = name.strip_prefix("HANDOFF_") else {
            return Ok(());
        };
        if rest.starts_with("TEST_") {
            // Reserved for the test harness (tests/common).
            return Ok(());
        }
        let key = rest.to_lowercase().replace("__", ".");
        let Some(&Key { name: k, kind, .. }) = keys::lookup(&key) else {
            return Err(ConfigError::new(format!(
                "environment variable {name}: {}",
                keys::unknown(&key, keys::env_name)
            )));
        };
        let canonical = keys::env_name(k);
        if name != canonical {
            return Err(ConfigError::new(format!(
                "environment variable {name}: configuration variables are upper case with \"__\" for the dot; use {canonical} for `{k}`"
            )));
        }
        let origin = format!(" (from {name})");
        self.set(k, keys::from_text(k, kind, value, &origin)?);
        Ok(())
    }

    fn apply_flag(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let &Key { name: k, kind, .. } = keys::lookup(key).ok_or_else(|| {
            ConfigError::new(format!(
                "--set {key}: {}",
                keys::unknown(key, |k| format!("`{k}`"))
            ))
        })?;
        self.set(
            k,
            keys::from_text(k, kind, value, " (from the command line)")?,
        );
        Ok(())
    }

    fn into_config(self) -> Result<Config, ConfigError> {
        let mut root = Table::new();
        for (key, value) in self.values {
            // `nats.tls.ca_file` goes into the table `nats`, then `tls`.
            let path: Vec<&str> = key.split('.').collect();
            insert(&mut root, &path, value);
        }
        // Every value was checked against its key's kind above, so this only
        // fails if the key table and the struct disagree (a test guards that).
        Value::Table(root)
            .try_into::<Config>()
            .map_err(|e| ConfigError::new(format!("configuration: {}", e.message().trim_end())))
    }
}

/// Puts `value` at the dotted `path`, making the tables on the way. No key is
/// both a value and a table (the key table's test guards that).
fn insert(table: &mut Table, path: &[&str], value: Value) {
    match path {
        [] => {}
        [name] => {
            table.insert(name.to_string(), value);
        }
        [first, rest @ ..] => {
            let entry = table
                .entry(first.to_string())
                .or_insert_with(|| Value::Table(Table::new()));
            if let Value::Table(inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}
