//! The worker's one NATS connection.
//!
//! It connects in the background and keeps reconnecting forever: a worker
//! started before its NATS server, or whose server restarts, picks up work as
//! soon as the server is back. Connection events are logged, reconnects
//! counted and readiness kept current by [`metrics::on_nats_event`].

use super::TransportError;
use crate::config::NatsConfig;
use crate::metrics::{self, Metrics, Readiness};
use crate::security::{self, Section, TlsFiles, pem::Material};
use async_nats::{Client, ConnectOptions, ServerAddr};
use std::time::Duration;

/// Connects to the servers in `config.url` with the configured auth and client
/// name. Returns at once; the first connection is made in the background.
pub async fn connect(
    config: &NatsConfig,
    metrics: Metrics,
    readiness: Readiness,
) -> Result<Client, TransportError> {
    let servers = server_addrs(&config.url)?;
    let mut options = ConnectOptions::new()
        .name(&config.name)
        .retry_on_initial_connect()
        .subscription_capacity(config.subscription_capacity)
        .max_reconnects(None)
        .event_callback(metrics::on_nats_event(metrics, readiness));
    match (&config.user, &config.password) {
        (Some(user), Some(password)) => {
            options = options.user_and_password(user.clone(), password.clone());
        }
        (None, None) => {}
        _ => return Err(TransportError::HalfUserPassword),
    }
    if let Some(token) = &config.token {
        options = options.token(token.clone());
    }
    if let Some(path) = &config.credentials_file {
        options =
            options
                .credentials_file(path)
                .await
                .map_err(|e| TransportError::Credentials {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
    }
    options = tls_options(options, config).await?;
    check_handshake(config, &servers).await?;
    let shown = config.url.clone();
    let client = options
        .connect(servers)
        .await
        .map_err(|e| TransportError::Connect {
            url: shown,
            reason: e.to_string(),
        })?;
    tracing::info!(url = %config.url, name = %config.name, "connecting to NATS (in the background, retrying until it answers)");
    Ok(client)
}

/// Applies `nats.tls.*` and `nats.nkey_seed_file`: the rustls config built
/// from the checked files (CA instead of the system roots, client
/// certificate), TLS required when it is in effect, TLS first, the NKey seed.
/// `setup` and `loadgen` use the same settings through this function.
pub async fn tls_options(
    mut options: ConnectOptions,
    config: &NatsConfig,
) -> Result<ConnectOptions, TransportError> {
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
) -> Result<(), TransportError> {
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
                Some(reason) => Err(TransportError::Tls {
                    url: crate::config::redact_urls(&config.url),
                    reason,
                }),
                None => Ok(()),
            }
        }
    }
}

/// `nats.url` split on commas, each parsed as a server address.
pub fn server_addrs(urls: &str) -> Result<Vec<ServerAddr>, TransportError> {
    let servers = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|url| {
            url.parse::<ServerAddr>()
                .map_err(|e| TransportError::BadUrl {
                    url: url.to_string(),
                    reason: e.to_string(),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err(TransportError::NoUrl);
    }
    Ok(servers)
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
        ];
        for (urls, expected) in cases {
            let got = server_addrs(urls).ok().map(|v| v.len());
            assert_eq!(got, *expected, "{urls:?}");
        }
    }
}
