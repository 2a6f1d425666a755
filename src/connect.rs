//! The worker's one NATS connection.
//!
//! The first connection must come within `nats.connect_timeout_secs`, or
//! `run` exits 1 naming the URL ([`first_connection`]). After it, the client
//! reconnects forever: a worker whose server restarts picks up work as soon
//! as the server is back. Connection events are logged, reconnects counted
//! and readiness kept current by [`metrics::on_nats_event`].
//!
//! Credentials written in `nats.url` become connect options
//! ([`crate::config::nats_url`]): the addresses async-nats gets, and logs,
//! hold none, and every URL this module shows is redacted.

use crate::config::{NatsConfig, nats_url, redact_urls};
use crate::metrics::{self, Metrics, Readiness};
use crate::security::{self, Section, TlsFiles, pem::Material};
use async_nats::{Client, ConnectOptions, ServerAddr};
use std::time::Duration;

/// Why the NATS connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// `nats.url` cannot be used (the message names the key).
    #[error(transparent)]
    Url(crate::config::ConfigError),
    #[error("nats.user and nats.password must be set together")]
    HalfUserPassword,
    /// The reason (the file's error) is the source, as every error with a
    /// source here: `{:#}` shows it after the message.
    #[error("nats.credentials_file {path:?} cannot be used")]
    Credentials {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to NATS at {url}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error(
        "cannot connect to NATS at {url}: no server answered within {secs} s (nats.connect_timeout_secs); check that nats-server runs there and is reachable"
    )]
    Unreachable { url: String, secs: u64 },
    #[error("TLS to NATS at {url} failed: {reason}")]
    Tls { url: String, reason: String },
    #[error(transparent)]
    Security(#[from] crate::security::SecurityError),
}

/// Connects to the servers in `config.url` with the configured auth and
/// client name. Returns once connected, or fails after
/// `config.connect_timeout_secs`.
pub async fn connect(
    config: &NatsConfig,
    metrics: Metrics,
    readiness: Readiness,
) -> Result<Client, ConnectError> {
    let (client, _closed) = connect_watched(config, metrics, readiness).await?;
    Ok(client)
}

/// [`connect`], with a [`Closed`] that tells when the client's connection
/// ended for good.
pub async fn connect_watched(
    config: &NatsConfig,
    metrics: Metrics,
    readiness: Readiness,
) -> Result<(Client, Closed), ConnectError> {
    let servers = parse_url(&config.url)?;
    let (closed_tx, closed) = tokio::sync::watch::channel(false);
    let on_event = metrics::on_nats_event(metrics, readiness);
    let mut options = ConnectOptions::new()
        .name(&config.name)
        .retry_on_initial_connect()
        .subscription_capacity(config.subscription_capacity)
        .ping_interval(Duration::from_secs(config.ping_interval_secs))
        .max_reconnects(None)
        .event_callback(move |event| {
            if matches!(event, async_nats::Event::Closed) {
                let _ = closed_tx.send(true);
            }
            on_event(event)
        });
    options = auth_options(options, config, servers.credentials).await?;
    check_handshake(config, &servers.addrs).await?;
    let shown = redact_urls(&config.url);
    let client = options
        .connect(servers.addrs)
        .await
        .map_err(|source| ConnectError::Connect {
            url: shown.clone(),
            source,
        })?;
    tracing::info!(url = %shown, name = %config.name, "connecting to NATS");
    let timeout = Duration::from_secs(config.connect_timeout_secs);
    first_connection(&client, timeout, &shown).await?;
    Ok((client, Closed(closed)))
}

/// Tells when a client's connection task has ended for good: drained or
/// closed (`Event::Closed`), or gone any other way (the task that runs the
/// client's event callback, and with it this watch's sender, ends with it).
/// The client reconnects forever otherwise, so this is the one way it stops.
pub struct Closed(tokio::sync::watch::Receiver<bool>);

impl Closed {
    /// Completes once the connection has ended for good.
    pub async fn wait(mut self) {
        // `Err`: the sender is gone, and with it the connection task.
        let _ = self.0.wait_for(|closed| *closed).await;
    }
}

/// Every NATS authentication and TLS setting of `config` on `options`:
/// user and password, token, credentials written in `nats.url`, a `.creds`
/// file, then TLS and the NKey seed ([`tls_options`]). The one place `run`,
/// `setup` and `loadgen` get them from, so the three connect alike.
pub async fn auth_options(
    mut options: ConnectOptions,
    config: &NatsConfig,
    url_credentials: Option<nats_url::UrlCredentials>,
) -> Result<ConnectOptions, ConnectError> {
    match (&config.user, &config.password) {
        (Some(user), Some(password)) => {
            options = options.user_and_password(user.clone(), password.clone());
        }
        (None, None) => {}
        _ => return Err(ConnectError::HalfUserPassword),
    }
    if let Some(token) = &config.token {
        options = options.token(token.clone());
    }
    options = with_url_credentials(options, url_credentials);
    if let Some(path) = &config.credentials_file {
        options =
            options
                .credentials_file(path)
                .await
                .map_err(|source| ConnectError::Credentials {
                    path: path.display().to_string(),
                    source,
                })?;
    }
    tls_options(options, config).await
}

/// `nats.url` as server addresses without credentials, and the credentials.
/// Errors name `nats.url` and show it redacted (loading has checked it
/// already, so `run` meets none).
pub fn parse_url(urls: &str) -> Result<nats_url::NatsServers, ConnectError> {
    nats_url::parse(urls).map_err(ConnectError::Url)
}

/// Credentials written in `nats.url` as connect options. Loading refuses
/// them together with `nats.user`, `nats.token` or `nats.credentials_file`.
fn with_url_credentials(
    options: ConnectOptions,
    credentials: Option<nats_url::UrlCredentials>,
) -> ConnectOptions {
    match credentials {
        Some(nats_url::UrlCredentials::UserPassword { user, password }) => {
            options.user_and_password(user, password)
        }
        Some(nats_url::UrlCredentials::Token(token)) => options.token(token),
        None => options,
    }
}

/// Applies `nats.tls.*` and `nats.nkey_seed_file`: the rustls config built
/// from the checked files (CA instead of the system roots, client
/// certificate), TLS required when it is in effect, TLS first, the NKey seed.
/// `setup` and `loadgen` use the same settings through this function.
pub async fn tls_options(
    mut options: ConnectOptions,
    config: &NatsConfig,
) -> Result<ConnectOptions, ConnectError> {
    if config.tls_required() {
        let material = Material::load(TlsFiles::nats(config))?;
        options = options
            .tls_client_config(material.client_config()?)
            .require_tls(true);
        if config.tls.first {
            options = options.tls_first();
        }
    }
    if let Some(path) = &config.nkey_seed_file {
        options = options.nkey(security::nkey::read_seed(path)?);
    }
    Ok(options)
}

/// How long the start-up TLS check waits for a server.
const HANDSHAKE_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// With TLS in effect, one connection attempt before the worker's own
/// (which retries in the background, logging failures at debug level only):
/// a TLS handshake that fails now (unknown CA, expired, name mismatch, client
/// certificate refused, a server without TLS) would fail forever, so it stops
/// the start with the reason in one line. An unreachable server passes here
/// and is left to the worker's connection.
pub async fn check_handshake(
    config: &NatsConfig,
    servers: &[ServerAddr],
) -> Result<(), ConnectError> {
    if !config.tls_required() {
        return Ok(());
    }
    let options = ConnectOptions::new()
        .name(format!("{} tls-check", config.name))
        .connection_timeout(HANDSHAKE_CHECK_TIMEOUT);
    let options = tls_options(options, config).await?;
    match options.connect(servers.to_vec()).await {
        Ok(client) => {
            drop(client);
            Ok(())
        }
        Err(e) => {
            match security::reason::tls_failure(&e, Section::Nats, config.tls.cert_file.is_some()) {
                Some(reason) => Err(ConnectError::Tls {
                    url: crate::config::redact_urls(&config.url),
                    reason,
                }),
                None => Ok(()),
            }
        }
    }
}

/// Waits until the client's first connection is made. The client retries in
/// the background meanwhile (`retry_on_initial_connect`); async-nats 0.51
/// has no way to await its state, so it is read every 20 ms.
async fn first_connection(
    client: &Client,
    timeout: Duration,
    shown_url: &str,
) -> Result<(), ConnectError> {
    let connected = async {
        while client.connection_state() != async_nats::connection::State::Connected {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(timeout, connected)
        .await
        .map_err(|_| ConnectError::Unreachable {
            url: shown_url.to_string(),
            secs: timeout.as_secs(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_split_on_commas() {
        let cases: &[(&str, Option<usize>)] = &[
            ("nats://127.0.0.1:4222", Some(1)),
            ("nats://a:4222, nats://b:4223", Some(2)),
            ("nats://a:4222,,", Some(1)),
            ("", None),
            (" , ", None),
            ("nats://a:notaport", None),
            ("nats://u:p@a:4222", Some(1)),
        ];
        for (urls, expected) in cases {
            let got = parse_url(urls).ok().map(|s| s.addrs.len());
            assert_eq!(got, *expected, "{urls:?}");
        }
    }
}
