//! The security section of the configuration, checked at load: every TLS
//! file and the NKey seed read and parsed, the credentials file present,
//! and the TLS rules that tie files to URLs. A file that cannot work stops the program (exit 2) before it
//! touches the network.

use super::pem::Material;
use super::{SecurityError, TlsFiles, nkey};
use crate::config::{Config, redact_urls};

/// The TLS material of both connections and the NKey seed, as read at load.
/// The connections read their files again when they are built (the same
/// code, `Material::load`), so a certificate renewed on disk is used by the
/// next connection; this is the check that they can be read at all.
pub struct TlsSettings {
    pub nats: Material,
    pub etcd: Material,
    pub nkey_seed: Option<String>,
}

impl TlsSettings {
    pub fn from_config(config: &Config) -> Result<TlsSettings, SecurityError> {
        if let Some(path) = &config.nats.credentials_file
            && !path.is_file()
        {
            return Err(SecurityError::CredentialsFile {
                path: path.display().to_string(),
            });
        }
        let nkey_seed = match &config.nats.nkey_seed_file {
            Some(path) => Some(nkey::read_seed(path)?),
            None => None,
        };
        let nats = Material::load(TlsFiles::nats(&config.nats))?;
        let etcd = Material::load(TlsFiles::etcd(&config.etcd))?;
        let websocket = config
            .nats
            .url
            .split(',')
            .any(|u| u.trim().starts_with("ws"));
        if config.nats.tls.first && websocket {
            return Err(SecurityError::FirstOverWebsocket);
        }
        // etcd-client refuses TLS options with an http:// endpoint, and a
        // certificate sent over plaintext would be pointless.
        let plain = config
            .etcd
            .endpoints
            .split(',')
            .map(str::trim)
            .find(|e| e.to_ascii_lowercase().starts_with("http://"));
        if config.etcd.tls_enabled()
            && let Some(endpoint) = plain
        {
            return Err(SecurityError::PlainEtcdEndpoint {
                endpoint: redact_urls(endpoint),
            });
        }
        Ok(TlsSettings {
            nats,
            etcd,
            nkey_seed,
        })
    }
}
