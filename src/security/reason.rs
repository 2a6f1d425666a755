//! A failed TLS handshake as one line that says why, in the operator's
//! terms: the error chains of async-nats and tonic bury rustls' reason a few
//! levels down (inside `io::Error`s, whose `source()` skips it).

use super::Section;
use rustls::{AlertDescription, CertificateError};
use std::error::Error;

/// Why the handshake failed, when `err` (or an error it wraps) is a TLS
/// error; `None` otherwise (refused connection, timeout, ...). `sent_cert`:
/// whether a client certificate was configured (a server that wants one and
/// got none answers "bad certificate" over TLS 1.2).
pub fn tls_failure(
    err: &(dyn Error + 'static),
    section: Section,
    sent_cert: bool,
) -> Option<String> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(describe(tls, section, sent_cert));
        }
        // `io::Error::source()` returns the wrapped error's source, skipping
        // the wrapped error itself: step into it instead.
        let wrapped = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref);
        current = match wrapped {
            Some(inner) => Some(inner as &(dyn Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// The reason, one line.
pub fn describe(e: &rustls::Error, section: Section, sent_cert: bool) -> String {
    let server = section.server();
    let ca = section.ca_key();
    match e {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer => format!(
                "the {server} server's certificate is signed by an unknown CA; {ca} must name the CA that signs it"
            ),
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                format!("the {server} server's certificate has expired")
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                format!("the {server} server's certificate is not valid yet (check the clocks)")
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!(
                    "the {server} server's certificate does not name the host it was reached by (name mismatch): {e}"
                )
            }
            CertificateError::Revoked => format!("the {server} server's certificate is revoked"),
            other => format!("the {server} server's certificate is invalid: {other:?}"),
        },
        rustls::Error::AlertReceived(alert) => match alert {
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::HandshakeFailure
                if !sent_cert =>
            {
                format!(
                    "the {server} server requires a client certificate ({} and {})",
                    section.cert_key(),
                    section.key_key()
                )
            }
            AlertDescription::CertificateRequired => format!(
                "the {server} server requires a client certificate ({} and {})",
                section.cert_key(),
                section.key_key()
            ),
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateRevoked
            | AlertDescription::AccessDenied => format!(
                "the {server} server refused the client certificate ({alert:?}): is it signed by a CA the server trusts, and still valid?"
            ),
            other => format!("the {server} server ended the TLS handshake: {other:?}"),
        },
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => format!(
            "the {server} server did not answer in TLS: it does not seem to offer TLS on that port"
        ),
        other => format!("TLS with the {server} server failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_found_inside_io_errors() {
        let tls = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let outer = std::io::Error::other(io);
        let reason = tls_failure(&outer, Section::Nats, true).unwrap_or_default();
        assert!(reason.contains("unknown CA"), "{reason}");
        assert!(reason.contains("nats.tls.ca_file"), "{reason}");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(tls_failure(&refused, Section::Nats, true), None);
    }

    #[test]
    fn reasons_are_one_line() {
        let cases = [
            rustls::Error::InvalidCertificate(CertificateError::Expired),
            rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
            rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
            rustls::Error::AlertReceived(AlertDescription::BadCertificate),
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
        ];
        for e in cases {
            let line = describe(&e, Section::Etcd, true);
            assert!(!line.contains('\n') && line.contains("etcd"), "{line}");
        }
    }
}
