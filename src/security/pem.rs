//! CA bundles, client certificates and keys, read from PEM files and checked
//! together: the CA certificates must be usable trust anchors, and the key
//! must belong to the client certificate.

use super::{Section, SecurityError, TlsFiles};
use rustls::ClientConfig;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

/// The TLS files of one connection, read and checked.
pub struct Material {
    section: Section,
    ca: Option<Pem<Vec<CertificateDer<'static>>>>,
    identity: Option<Identity>,
    /// The certificate and key files, for messages.
    cert_path: String,
    key_path: String,
}

/// Parsed content and the file's bytes (tonic parses PEM itself).
struct Pem<T> {
    parsed: T,
    bytes: Vec<u8>,
}

struct Identity {
    chain: Pem<Vec<CertificateDer<'static>>>,
    key: Pem<PrivateKeyDer<'static>>,
}

/// The crypto provider of every TLS connection the worker makes. Named
/// explicitly rather than taken from the process default, so a second
/// provider compiled in by some dependency cannot make rustls refuse to
/// choose (it panics when two are compiled in and none is installed).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, SecurityError> {
    std::fs::read(path).map_err(|source| SecurityError::Unreadable {
        key,
        path: path.display().to_string(),
        source,
    })
}

/// Every certificate in a PEM file; at least one. The parser's own error
/// text is not shown: it may quote the file.
fn certificates(
    key: &'static str,
    path: &Path,
) -> Result<Pem<Vec<CertificateDer<'static>>>, SecurityError> {
    let bytes = read(key, path)?;
    let parsed = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .filter(|certs| !certs.is_empty())
        .ok_or_else(|| SecurityError::NotPem {
            key,
            path: path.display().to_string(),
            expected: "one or more PEM certificates (-----BEGIN CERTIFICATE-----)",
        })?;
    Ok(Pem { parsed, bytes })
}

fn private_key(
    key: &'static str,
    path: &Path,
) -> Result<Pem<PrivateKeyDer<'static>>, SecurityError> {
    let bytes = read(key, path)?;
    let parsed = PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| SecurityError::NotPem {
        key,
        path: path.display().to_string(),
        expected: "a PEM private key (-----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)",
    })?;
    Ok(Pem { parsed, bytes })
}

impl Material {
    /// Reads and checks every file that is set.
    pub fn load(files: TlsFiles<'_>) -> Result<Material, SecurityError> {
        let section = files.section;
        let ca = match files.ca_file {
            Some(path) => {
                let ca = certificates(section.ca_key(), path)?;
                let mut store = RootCertStore::empty();
                for cert in &ca.parsed {
                    store
                        .add(cert.clone())
                        .map_err(|source| SecurityError::BadCertificate {
                            key: section.ca_key(),
                            path: path.display().to_string(),
                            source: Box::new(source),
                        })?;
                }
                Some(ca)
            }
            None => None,
        };
        let identity = match (files.cert_file, files.key_file) {
            (Some(cert), Some(key)) => Some(Identity {
                chain: certificates(section.cert_key(), cert)?,
                key: private_key(section.key_key(), key)?,
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(SecurityError::HalfIdentity {
                    missing: section.key_key(),
                    set: section.cert_key(),
                });
            }
            (None, Some(_)) => {
                return Err(SecurityError::HalfIdentity {
                    missing: section.cert_key(),
                    set: section.key_key(),
                });
            }
        };
        let shown = |p: Option<&Path>| p.map(|p| p.display().to_string()).unwrap_or_default();
        let material = Material {
            section,
            ca,
            identity,
            cert_path: shown(files.cert_file),
            key_path: shown(files.key_file),
        };
        // Builds a config once to check the key against its certificate.
        material.config_with(RootCertStore::empty())?;
        Ok(material)
    }

    /// The rustls client config: the CA file's certificates as the only
    /// roots when set, else the system's; the client certificate when set.
    pub fn client_config(&self) -> Result<ClientConfig, SecurityError> {
        let mut roots = RootCertStore::empty();
        match &self.ca {
            Some(ca) => {
                roots.add_parsable_certificates(ca.parsed.iter().cloned());
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(native.certs);
                if roots.is_empty() {
                    return Err(SecurityError::NoSystemRoots {
                        what: self.section.server(),
                        key: self.section.ca_key(),
                    });
                }
            }
        }
        self.config_with(roots)
    }

    /// The config over `roots`; fails when the key does not belong to the
    /// client certificate (or is of a kind rustls cannot sign with).
    fn config_with(&self, roots: RootCertStore) -> Result<ClientConfig, SecurityError> {
        let mismatch = |source: rustls::Error| SecurityError::KeyMismatch {
            cert_key: self.section.cert_key(),
            key_key: self.section.key_key(),
            cert_path: self.cert_path.clone(),
            key_path: self.key_path.clone(),
            source: Box::new(source),
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(mismatch)?
            .with_root_certificates(roots);
        match &self.identity {
            Some(id) => builder
                .with_client_auth_cert(id.chain.parsed.clone(), id.key.parsed.clone_key())
                .map_err(mismatch),
            None => Ok(builder.with_no_client_auth()),
        }
    }

    /// The etcd client's TLS options (tonic parses the same PEM bytes).
    pub fn etcd_options(&self) -> etcd_client::TlsOptions {
        let mut options = etcd_client::TlsOptions::new();
        options = match &self.ca {
            Some(ca) => options.ca_certificate(etcd_client::Certificate::from_pem(&ca.bytes)),
            None => options.with_native_roots(),
        };
        if let Some(id) = &self.identity {
            options = options.identity(etcd_client::Identity::from_pem(
                &id.chain.bytes,
                &id.key.bytes,
            ));
        }
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn files<'a>(
        ca: Option<&'a Path>,
        cert: Option<&'a Path>,
        key: Option<&'a Path>,
    ) -> TlsFiles<'a> {
        TlsFiles {
            section: Section::Nats,
            ca_file: ca,
            cert_file: cert,
            key_file: key,
        }
    }

    #[test]
    fn a_file_that_is_not_pem_is_refused_without_quoting_it() {
        let junk = file("s3cret-not-a-certificate\n");
        let err = Material::load(files(Some(junk.path()), None, None))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.starts_with("nats.tls.ca_file: "), "{err}");
        assert!(err.contains("is not PEM"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn a_certificate_without_its_key_is_refused() {
        let junk = file("x");
        let err = Material::load(files(None, Some(junk.path()), None))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.starts_with("nats.tls.key_file: not set"), "{err}");
    }
}
