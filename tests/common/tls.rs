//! Certificates made at test time (rcgen): a CA, server and client
//! certificates signed by it, and a second CA with its own client
//! certificate, written as PEM files into a temporary directory; plus the
//! nats-server and etcd settings that use them.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::PathBuf;

/// A throwaway PKI. Files (all PEM): `ca.pem`; `server.pem`/`server-key.pem`
/// for localhost and 127.0.0.1; `client.pem`/`client-key.pem`;
/// `expired-server.pem`/`-key.pem` (expired in 2020);
/// `elsewhere-server.pem`/`-key.pem` (valid for another name only);
/// `other-ca.pem`, `other-client.pem`/`other-client-key.pem` (another CA).
pub struct Pki {
    dir: tempfile::TempDir,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA cert")
}

/// A leaf certificate and its key, as PEM.
fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    names: &[&str],
    usages: &[ExtendedKeyUsagePurpose],
    expired: bool,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(names).expect("leaf params");
    params
        .distinguished_name
        .push(DnType::CommonName, "prefill-handoff test");
    params.extended_key_usages = usages.to_vec();
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    if expired {
        params.not_before = rcgen::date_time_ymd(2019, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 1, 1);
    }
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, issuer).expect("sign leaf");
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    pub fn new() -> Pki {
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).expect("write a PEM file");
        };
        let main = ca("prefill-handoff test CA");
        let other = ca("another CA");
        write("ca.pem", &main.pem());
        write("other-ca.pem", &other.pem());
        // etcd's gRPC gateway dials etcd itself with the server certificate,
        // so the server certificate is also a client certificate.
        let pairs = [
            (
                "server",
                leaf(
                    &main,
                    &["localhost", "127.0.0.1"],
                    &[ServerAuth, ClientAuth],
                    false,
                ),
            ),
            (
                "client",
                leaf(&main, &["prefill-handoff"], &[ClientAuth], false),
            ),
            (
                "expired-server",
                leaf(&main, &["localhost", "127.0.0.1"], &[ServerAuth], true),
            ),
            (
                "elsewhere-server",
                leaf(&main, &["elsewhere.example"], &[ServerAuth], false),
            ),
            (
                "other-client",
                leaf(&other, &["prefill-handoff"], &[ClientAuth], false),
            ),
        ];
        for (name, (cert, key)) in pairs {
            write(&format!("{name}.pem"), &cert);
            write(&format!("{name}-key.pem"), &key);
        }
        Pki { dir }
    }

    /// The path of one of the files, as a string for configs and env.
    pub fn path(&self, name: &str) -> String {
        self.file(name).display().to_string()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes another file into the PKI directory (for broken-file cases).
    #[allow(
        dead_code,
        reason = "the offline configuration tests use it; the server binary includes this module too"
    )]
    pub fn write(&self, name: &str, text: &str) -> String {
        std::fs::write(self.file(name), text).expect("write a file");
        self.path(name)
    }

    /// A nats-server `tls { }` block serving `server` (e.g. "server",
    /// "expired-server"); `verify` asks every client for a certificate
    /// signed by `ca.pem` (mutual TLS).
    pub fn nats_tls_block(&self, server: &str, verify: bool, handshake_first: bool) -> String {
        let mut block = format!(
            "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: {verify}\n  timeout: 5\n",
            self.path(&format!("{server}.pem")),
            self.path(&format!("{server}-key.pem")),
            self.path("ca.pem"),
        );
        if handshake_first {
            block.push_str("  handshake_first: true\n");
        }
        block.push_str("}\n");
        block
    }

    /// The worker's environment for NATS mutual TLS with `ca.pem` and the
    /// given client certificate (`client`, `other-client`).
    pub fn nats_env(&self, client: &str) -> Vec<(String, String)> {
        vec![
            ("HANDOFF_NATS__TLS__CA_FILE".into(), self.path("ca.pem")),
            (
                "HANDOFF_NATS__TLS__CERT_FILE".into(),
                self.path(&format!("{client}.pem")),
            ),
            (
                "HANDOFF_NATS__TLS__KEY_FILE".into(),
                self.path(&format!("{client}-key.pem")),
            ),
        ]
    }

    /// The worker's environment for etcd mutual TLS.
    pub fn etcd_env(&self) -> Vec<(String, String)> {
        vec![
            ("HANDOFF_ETCD__TLS__CA_FILE".into(), self.path("ca.pem")),
            (
                "HANDOFF_ETCD__TLS__CERT_FILE".into(),
                self.path("client.pem"),
            ),
            (
                "HANDOFF_ETCD__TLS__KEY_FILE".into(),
                self.path("client-key.pem"),
            ),
        ]
    }
}

/// A nats-server build's version, e.g. (2, 9, 10); `None` if it cannot be
/// read.
pub fn nats_server_version(binary: &std::path::Path) -> Option<(u32, u32, u32)> {
    let out = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let version = text.split_whitespace().find(|w| w.starts_with('v'))?;
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse().ok());
    Some((parts.next()?, parts.next()?, parts.next().unwrap_or(0)))
}
