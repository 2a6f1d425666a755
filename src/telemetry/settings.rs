//! Where spans go: `otel.*` and the standard `OTEL_*` environment, resolved
//! once at load ([`Settings::from_config`]). Pure (the environment is passed
//! in), so the precedence is tested without touching the process's
//! environment. The ranges of `otel.*` are the key table's; what the
//! endpoint and the protocol mean is checked here, for the key and the
//! standard variables alike.

use crate::config::{OtelConfig, redact_urls};
use std::time::Duration;

/// The standard variables read when `otel.endpoint` / `otel.protocol` are
/// unset (OpenTelemetry's OTLP exporter specification).
pub const ENV_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const ENV_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const ENV_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
pub const ENV_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
pub const ENV_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";

/// The OTLP path of traces on an OTLP/HTTP collector.
const HTTP_TRACES_PATH: &str = "/v1/traces";

/// OTLP over gRPC (port 4317 by convention) or over HTTP with protobuf
/// bodies (4318).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    Http,
}

impl Protocol {
    /// `grpc`, or `http` / `http/protobuf` (the standard variable's
    /// spelling). `http/json` is not offered: protobuf is what every
    /// collector takes and what the exporter here sends.
    pub fn parse(text: &str) -> Option<Protocol> {
        match text.trim().to_ascii_lowercase().as_str() {
            "grpc" => Some(Protocol::Grpc),
            "http" | "http/protobuf" => Some(Protocol::Http),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http/protobuf",
        }
    }
}

/// Everything the exporter needs; `None` from [`Settings::from_config`] means
/// tracing is off.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The full URL spans are sent to (for HTTP, with `/v1/traces`).
    pub endpoint: String,
    pub protocol: Protocol,
    pub sampling_ratio: f64,
    pub queue_spans: usize,
    pub export_timeout: Duration,
}

/// A key or standard variable that cannot be used (`name` is either).
/// Exit 2, like any configuration error.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    #[error(
        "{name}: {value:?} is not one of \"grpc\", \"http\" (\"http/protobuf\"), the protocols this worker exports with"
    )]
    Protocol { name: &'static str, value: String },
    /// `shown`: the URL with any credentials hidden.
    #[error(
        "{name}: {shown:?} is not a collector URL; expected http://host:port (e.g. http://127.0.0.1:4317 for OTLP/gRPC, http://127.0.0.1:4318 for OTLP/HTTP; TLS to the collector is not supported: use a collector agent on the node)"
    )]
    Endpoint { name: &'static str, shown: String },
}

impl Settings {
    /// `otel.endpoint` wins; unset, the standard variables name the
    /// collector, as in every OpenTelemetry SDK: the signal-specific one used
    /// as it is, the generic one with `/v1/traces` added for HTTP. With no
    /// endpoint anywhere, or `OTEL_SDK_DISABLED=true`, tracing is off.
    ///
    /// The key's values are checked even when tracing ends up off, so a bad
    /// key is refused whatever the environment says.
    pub fn from_config(
        config: &OtelConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Settings>, SettingsError> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let chosen = match &config.protocol {
            Some(value) => Some(("otel.protocol", value.clone())),
            None => [ENV_TRACES_PROTOCOL, ENV_PROTOCOL]
                .into_iter()
                .find_map(|name| var(name).map(|v| (name, v))),
        };
        let protocol = match chosen {
            Some((name, value)) => {
                Protocol::parse(&value).ok_or(SettingsError::Protocol { name, value })?
            }
            None => Protocol::Grpc,
        };
        if let Some(endpoint) = &config.endpoint {
            collector_url("otel.endpoint", endpoint)?;
        }
        if var(ENV_SDK_DISABLED).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        // (the URL, whether it is the generic kind that gets the HTTP path)
        let (endpoint, generic, name) = match &config.endpoint {
            Some(e) => (e.clone(), true, "otel.endpoint"),
            None => match (var(ENV_TRACES_ENDPOINT), var(ENV_ENDPOINT)) {
                (Some(e), _) => (e, false, ENV_TRACES_ENDPOINT),
                (None, Some(e)) => (e, true, ENV_ENDPOINT),
                (None, None) => return Ok(None),
            },
        };
        let endpoint = endpoint.trim().to_string();
        collector_url(name, &endpoint)?;
        let endpoint = match protocol {
            Protocol::Http if generic => with_traces_path(&endpoint),
            _ => endpoint,
        };
        Ok(Some(Settings {
            endpoint,
            protocol,
            sampling_ratio: config.sampling_ratio,
            queue_spans: config.queue_spans,
            export_timeout: Duration::from_millis(config.export_timeout_ms),
        }))
    }
}

/// `http://host[:port][/path]`. Not `https://`: the exporter is built
/// without TLS (the usual deployment sends to a collector agent on the
/// node), and a URL it cannot use is better refused at start.
fn collector_url(name: &'static str, text: &str) -> Result<(), SettingsError> {
    let lower = text.trim().to_ascii_lowercase();
    let ok = lower
        .strip_prefix("http://")
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/') && !rest.contains(' '));
    if ok {
        Ok(())
    } else {
        Err(SettingsError::Endpoint {
            name,
            shown: redact_urls(text),
        })
    }
}

/// `http://c:4318` → `http://c:4318/v1/traces`; a URL that has a path of its
/// own keeps it, with `/v1/traces` appended (the specification's rule for
/// the generic variable, applied to `otel.endpoint` too).
fn with_traces_path(endpoint: &str) -> String {
    format!("{}{HTTP_TRACES_PATH}", endpoint.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(endpoint: Option<&str>, protocol: Option<&str>) -> OtelConfig {
        OtelConfig {
            endpoint: endpoint.map(str::to_string),
            protocol: protocol.map(str::to_string),
            ..OtelConfig::default()
        }
    }

    /// (name, otel.endpoint, otel.protocol, environment, expected endpoint and protocol)
    type Row<'a> = (
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        &'a [(&'a str, &'a str)],
        Option<(&'a str, Protocol)>,
    );

    /// One row per precedence rule.
    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "one table of rules and one check of every row"
    )]
    fn precedence() {
        use Protocol::{Grpc, Http};
        let rows: &[Row] = &[
            ("nothing set: off", None, None, &[], None),
            (
                "key only",
                Some("http://c:4317"),
                None,
                &[],
                Some(("http://c:4317", Grpc)),
            ),
            (
                "key beats the variable",
                Some("http://c:4317"),
                None,
                &[(ENV_ENDPOINT, "http://other:4317")],
                Some(("http://c:4317", Grpc)),
            ),
            (
                "generic variable",
                None,
                None,
                &[(ENV_ENDPOINT, "http://c:4317")],
                Some(("http://c:4317", Grpc)),
            ),
            (
                "signal variable beats the generic one",
                None,
                None,
                &[
                    (ENV_ENDPOINT, "http://a:4317"),
                    (ENV_TRACES_ENDPOINT, "http://b:4317"),
                ],
                Some(("http://b:4317", Grpc)),
            ),
            (
                "http: the generic variable gets /v1/traces",
                None,
                None,
                &[
                    (ENV_ENDPOINT, "http://c:4318/"),
                    (ENV_PROTOCOL, "http/protobuf"),
                ],
                Some(("http://c:4318/v1/traces", Http)),
            ),
            (
                "http: the signal variable is used as it is",
                None,
                None,
                &[
                    (ENV_TRACES_ENDPOINT, "http://c:4318/custom"),
                    (ENV_PROTOCOL, "http/protobuf"),
                ],
                Some(("http://c:4318/custom", Http)),
            ),
            (
                "http: the key gets /v1/traces",
                Some("http://c:4318"),
                Some("http"),
                &[],
                Some(("http://c:4318/v1/traces", Http)),
            ),
            (
                "the protocol key beats the variable",
                Some("http://c:4317"),
                Some("grpc"),
                &[(ENV_PROTOCOL, "http/protobuf")],
                Some(("http://c:4317", Grpc)),
            ),
            (
                "empty variables count as unset",
                None,
                None,
                &[(ENV_ENDPOINT, " ")],
                None,
            ),
            (
                "OTEL_SDK_DISABLED turns it off",
                Some("http://c:4317"),
                None,
                &[(ENV_SDK_DISABLED, "TRUE")],
                None,
            ),
        ];
        for (name, endpoint, protocol, env, want) in rows {
            let env: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let got = Settings::from_config(&config(*endpoint, *protocol), |n| {
                env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
            })
            .unwrap();
            let got = got.map(|s| (s.endpoint, s.protocol));
            let want = want.map(|(e, p)| (e.to_string(), p));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn unusable_variables_are_errors_naming_them() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            }
        };
        let bad_protocol = Settings::from_config(
            &config(None, None),
            env(&[(ENV_ENDPOINT, "http://c:4317"), (ENV_PROTOCOL, "http/json")]),
        );
        assert_eq!(
            bad_protocol,
            Err(SettingsError::Protocol {
                name: ENV_PROTOCOL,
                value: "http/json".into()
            })
        );
        for url in ["c:4317", "https://c:4317", "http://"] {
            let pairs: &'static [(&'static str, &'static str)] = match url {
                "c:4317" => &[(ENV_ENDPOINT, "c:4317")],
                "https://c:4317" => &[(ENV_ENDPOINT, "https://c:4317")],
                _ => &[(ENV_ENDPOINT, "http://")],
            };
            let bad_url = Settings::from_config(&config(None, None), env(pairs));
            assert_eq!(
                bad_url,
                Err(SettingsError::Endpoint {
                    name: ENV_ENDPOINT,
                    shown: url.into()
                }),
                "{url}"
            );
        }
    }
}
