//! One TLS handshake on its own, to learn why a server refuses the client.
//!
//! tonic reports a refused etcd handshake as "connection closed": with TLS
//! 1.3 the server checks the client certificate after the client has
//! finished its side, and its alert reaches a connection hyper already
//! treats as broken. Reading once after the handshake catches that alert.

use super::Section;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// How long the probe waits for each step (connect, handshake, the read
/// that would carry the server's alert).
const STEP: Duration = Duration::from_secs(3);

/// The TLS reason `endpoint` (`https://host:port`) refuses this client
/// config for; `None` when the handshake holds or the server is unreachable
/// (left to the real client to report).
pub async fn handshake(
    endpoint: &str,
    mut config: ClientConfig,
    section: Section,
    sent_cert: bool,
) -> Option<String> {
    let (host, port) = host_port(endpoint)?;
    let name = ServerName::try_from(host.to_string()).ok()?;
    // etcd speaks gRPC: HTTP/2 over TLS.
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::time::timeout(STEP, TcpStream::connect((host, port)))
        .await
        .ok()?
        .ok()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut stream = match tokio::time::timeout(STEP, connector.connect(name, tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return super::reason::tls_failure(&e, section, sent_cert),
        Err(_) => return None,
    };
    let mut buf = [0u8; 64];
    match tokio::time::timeout(STEP, stream.read(&mut buf)).await {
        Ok(Err(e)) => super::reason::tls_failure(&e, section, sent_cert),
        _ => None,
    }
}

/// `https://host:port/...` → (host, port); IPv6 hosts in brackets.
fn host_port(endpoint: &str) -> Option<(&str, u16)> {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = authority.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_split_into_host_and_port() {
        let cases = [
            ("https://127.0.0.1:2379", Some(("127.0.0.1", 2379))),
            ("https://etcd.example:2379/", Some(("etcd.example", 2379))),
            ("https://[::1]:2379", Some(("::1", 2379))),
            ("127.0.0.1:2379", Some(("127.0.0.1", 2379))),
            ("https://etcd.example", None),
        ];
        for (endpoint, want) in cases {
            assert_eq!(host_port(endpoint), want, "{endpoint}");
        }
    }
}
