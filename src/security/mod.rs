//! Secure transport material: TLS files for NATS and etcd, and the NATS
//! NKey seed.
//!
//! Every file is read and parsed when the configuration is loaded
//! ([`TlsSettings::from_config`]), before anything touches the network, and
//! again (the same code) when a
//! connection is built, so a file that cannot work is a config error (exit 2)
//! naming its key and path. Certificates, keys and seeds are never logged and
//! never quoted in an error: messages name the file, not its content.
//!
//! - [`pem`]: CA bundles, client certificates and keys → a checked
//!   [`pem::Material`], and from it the rustls config for NATS and the
//!   tonic TLS options for etcd.
//! - [`nkey`]: the NKey user seed file.
//! - `settings.rs`: [`TlsSettings::from_config`], all of it checked at load.
//! - [`probe`]: one handshake on its own, when a client library hides why
//!   the server refused it.
//! - [`reason`]: a failed TLS handshake as one line that says why (unknown
//!   CA, expired, name mismatch, client certificate refused, no TLS).

pub mod nkey;
pub mod pem;
pub mod probe;
pub mod reason;
mod settings;

pub use settings::TlsSettings;

use std::path::Path;

/// Why a TLS file or seed file cannot be used. Each message names the
/// configuration key and the file, never the file's content; the reason
/// from the file system or rustls is the error's source (shown after it by
/// `{:#}`).
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error("{key}: cannot read {path}")]
    Unreadable {
        key: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{key}: {path} is not PEM: expected {expected}")]
    NotPem {
        key: &'static str,
        path: String,
        expected: &'static str,
    },
    #[error("{key}: {path} holds a certificate that cannot be used")]
    BadCertificate {
        key: &'static str,
        path: String,
        /// Boxed: rustls' error is large, and this one travels in every
        /// `Result` of loading and connecting.
        #[source]
        source: Box<rustls::Error>,
    },
    #[error(
        "{missing}: not set, but {set} is; a client certificate needs its key and the key its certificate"
    )]
    HalfIdentity {
        missing: &'static str,
        set: &'static str,
    },
    #[error(
        "{key_key}: the key in {key_path} does not belong to the certificate in {cert_path} ({cert_key})"
    )]
    KeyMismatch {
        cert_key: &'static str,
        key_key: &'static str,
        cert_path: String,
        key_path: String,
        /// Boxed: rustls' error is large, and this one travels in every
        /// `Result` of loading and connecting.
        #[source]
        source: Box<rustls::Error>,
    },
    #[error("nats.credentials_file: {path} is not a readable file")]
    CredentialsFile { path: String },
    #[error("nats.nkey_seed_file: {path} cannot be read")]
    NkeyUnreadable {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// `reason` is ours: the nkeys parser's own error could quote the seed.
    #[error("nats.nkey_seed_file: {path} {reason}")]
    NkeySeed { path: String, reason: &'static str },
    #[error(
        "nats.tls.first: applies to nats:// and tls:// URLs only; a websocket URL negotiates TLS itself"
    )]
    FirstOverWebsocket,
    #[error(
        "etcd.endpoints: {endpoint:?} is http:// while etcd TLS is in use (an https:// endpoint or an etcd.tls.* file); use https:// for every endpoint"
    )]
    PlainEtcdEndpoint { endpoint: String },
    #[error(
        "no system root certificates were found to check the {what} server's certificate; set {key} to the CA that signs it"
    )]
    NoSystemRoots {
        what: &'static str,
        key: &'static str,
    },
}

/// The TLS files of one connection, with the configuration keys they came
/// from (for messages).
#[derive(Debug, Clone, Copy)]
pub struct TlsFiles<'a> {
    /// `nats.tls` or `etcd.tls`.
    pub section: Section,
    pub ca_file: Option<&'a Path>,
    pub cert_file: Option<&'a Path>,
    pub key_file: Option<&'a Path>,
}

/// Which connection a set of TLS files is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Nats,
    Etcd,
}

impl Section {
    pub fn ca_key(self) -> &'static str {
        match self {
            Section::Nats => "nats.tls.ca_file",
            Section::Etcd => "etcd.tls.ca_file",
        }
    }
    pub fn cert_key(self) -> &'static str {
        match self {
            Section::Nats => "nats.tls.cert_file",
            Section::Etcd => "etcd.tls.cert_file",
        }
    }
    pub fn key_key(self) -> &'static str {
        match self {
            Section::Nats => "nats.tls.key_file",
            Section::Etcd => "etcd.tls.key_file",
        }
    }
    pub fn server(self) -> &'static str {
        match self {
            Section::Nats => "NATS",
            Section::Etcd => "etcd",
        }
    }
}

impl<'a> TlsFiles<'a> {
    pub fn nats(c: &'a crate::config::NatsConfig) -> Self {
        TlsFiles {
            section: Section::Nats,
            ca_file: c.tls.ca_file.as_deref(),
            cert_file: c.tls.cert_file.as_deref(),
            key_file: c.tls.key_file.as_deref(),
        }
    }

    pub fn etcd(c: &'a crate::config::EtcdConfig) -> Self {
        TlsFiles {
            section: Section::Etcd,
            ca_file: c.tls.ca_file.as_deref(),
            cert_file: c.tls.cert_file.as_deref(),
            key_file: c.tls.key_file.as_deref(),
        }
    }
}
