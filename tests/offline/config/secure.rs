//! The secure-transport keys: every TLS file and the NKey seed file is read
//! and parsed when the configuration is checked; a file that cannot work is
//! an error naming the key and the file (never its content), exit 2 before
//! the network.

use super::load;
use crate::tls::Pki;
use prefill_handoff::config::env_name;

/// What a bad file looks like: its content (`None`: no such file).
fn broken(pki: &Pki, case: &str) -> String {
    match case {
        "missing" => "/nonexistent/handoff-test.pem".to_string(),
        "not pem" => pki.write("junk.pem", "s3cret junk, not PEM\n"),
        other => panic!("unknown case {other}"),
    }
}

/// Each TLS key, with each way its file can be wrong: the message names the
/// key, the file, and what was expected.
#[test]
fn every_tls_file_key_has_its_config_error_rows() {
    let pki = Pki::new();
    for section in ["nats", "etcd"] {
        for (file_key, case, says) in [
            ("ca_file", "missing", "cannot read"),
            (
                "ca_file",
                "not pem",
                "is not PEM: expected one or more PEM certificates",
            ),
            ("cert_file", "missing", "cannot read"),
            (
                "cert_file",
                "not pem",
                "is not PEM: expected one or more PEM certificates",
            ),
            ("key_file", "missing", "cannot read"),
            (
                "key_file",
                "not pem",
                "is not PEM: expected a PEM private key",
            ),
        ] {
            let key = format!("{section}.tls.{file_key}");
            let path = broken(&pki, case);
            // The other half of the client identity is a good file, so the
            // row is about this key's file alone.
            let mut env = vec![(env_name(&key), path.clone())];
            match file_key {
                "cert_file" => env.push((
                    env_name(&format!("{section}.tls.key_file")),
                    pki.path("client-key.pem"),
                )),
                "key_file" => env.push((
                    env_name(&format!("{section}.tls.cert_file")),
                    pki.path("client.pem"),
                )),
                _ => {}
            }
            if section == "etcd" {
                env.push((
                    "HANDOFF_ETCD__ENDPOINTS".into(),
                    "https://127.0.0.1:2379".into(),
                ));
            }
            let pairs: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let message = match load(None, &pairs, &[]) {
                Ok(_) => panic!("{key} {case}: accepted"),
                Err(e) => e.to_string(),
            };
            let row = format!("{key} {case}: {message}");
            assert!(message.starts_with(&format!("{key}: ")), "{row}");
            assert!(message.contains(&path) && message.contains(says), "{row}");
            assert!(!message.contains("s3cret"), "{row}: shows the content");
        }
    }
}

#[test]
fn a_client_certificate_needs_its_own_key() {
    let pki = Pki::new();
    let rows: &[(&str, &str, &[&str])] = &[
        (
            "nats",
            "cert only",
            &["nats.tls.key_file: not set", "nats.tls.cert_file"],
        ),
        (
            "nats",
            "key only",
            &["nats.tls.cert_file: not set", "nats.tls.key_file"],
        ),
        (
            "nats",
            "mismatch",
            &[
                "nats.tls.key_file",
                "does not belong",
                "other-client-key.pem",
            ],
        ),
        ("etcd", "cert only", &["etcd.tls.key_file: not set"]),
        ("etcd", "key only", &["etcd.tls.cert_file: not set"]),
        (
            "etcd",
            "mismatch",
            &["etcd.tls.key_file", "does not belong"],
        ),
    ];
    for (section, case, says) in rows {
        let cert = env_name(&format!("{section}.tls.cert_file"));
        let key = env_name(&format!("{section}.tls.key_file"));
        let mut env = match *case {
            "cert only" => vec![(cert, pki.path("client.pem"))],
            "key only" => vec![(key, pki.path("client-key.pem"))],
            _ => vec![
                (cert, pki.path("client.pem")),
                (key, pki.path("other-client-key.pem")),
            ],
        };
        env.push((
            "HANDOFF_ETCD__ENDPOINTS".into(),
            "https://127.0.0.1:2379".into(),
        ));
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let message = load(None, &pairs, &[]).err().map(|e| e.to_string());
        let message = message.unwrap_or_else(|| panic!("{section} {case}: accepted"));
        for needle in *says {
            assert!(message.contains(needle), "{section} {case}: {message}");
        }
    }
}

#[test]
fn good_files_load_from_every_layer_and_nested_tables() {
    let pki = Pki::new();
    let file = format!(
        "[nats]\nurl = \"tls://127.0.0.1:4222\"\n[nats.tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\nfirst = true\n\
         [etcd]\nendpoints = \"https://127.0.0.1:2379\"\n[etcd.tls]\nca_file = {:?}\n",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client-key.pem"),
        pki.path("ca.pem"),
    );
    let c = load(Some(&file), &[], &[]).expect("good TLS files load");
    assert_eq!(
        c.nats.tls.ca_file.as_deref(),
        Some(pki.file("ca.pem").as_path())
    );
    assert!(c.nats.tls.first && c.nats.tls_required() && c.etcd.tls_enabled());
    // An empty value unsets a file key; the flag beats the environment.
    let ca = pki.path("ca.pem");
    let env = [("HANDOFF_NATS__TLS__CA_FILE", ca.as_str())];
    let c = load(None, &env, &[("nats.tls.ca_file", "")]).unwrap();
    assert_eq!(c.nats.tls.ca_file, None);
    assert!(
        !c.nats.tls_required(),
        "no TLS file, no tls:// URL, not required"
    );
    // A TLS file makes TLS required even when `required` says false.
    let c = load(None, &env, &[("nats.tls.required", "false")]).unwrap();
    assert!(c.nats.tls_required());
}

#[test]
fn etcd_tls_needs_https_endpoints() {
    let pki = Pki::new();
    let ca = pki.path("ca.pem");
    let env = [
        ("HANDOFF_ETCD__TLS__CA_FILE", ca.as_str()),
        ("HANDOFF_ETCD__ENDPOINTS", "https://a:2379,http://b:2379"),
    ];
    let message = load(None, &env, &[])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        message.starts_with("etcd.endpoints: ")
            && message.contains("http://b:2379")
            && message.contains("https://"),
        "{message}"
    );
}

#[test]
fn the_nkey_seed_file_is_one_more_exclusive_auth_method() {
    let pki = Pki::new();
    let user = nkeys::KeyPair::new_user().seed().unwrap();
    let account = nkeys::KeyPair::new_account().seed().unwrap();
    let good = pki.write("user.nk", &format!("{user}\n"));
    type Row<'a> = (Vec<(&'a str, String)>, Vec<&'a str>);
    let rows: Vec<Row> = vec![
        (
            vec![("HANDOFF_NATS__NKEY_SEED_FILE", "/nonexistent/x.nk".into())],
            vec!["nats.nkey_seed_file: /nonexistent/x.nk", "cannot be read"],
        ),
        (
            vec![(
                "HANDOFF_NATS__NKEY_SEED_FILE",
                pki.write("junk.nk", "s3cret\n"),
            )],
            vec!["nats.nkey_seed_file", "does not hold an NKey seed"],
        ),
        (
            vec![(
                "HANDOFF_NATS__NKEY_SEED_FILE",
                pki.write("acct.nk", &account),
            )],
            vec!["nats.nkey_seed_file", "not a user seed"],
        ),
        (
            vec![
                ("HANDOFF_NATS__NKEY_SEED_FILE", good.clone()),
                ("HANDOFF_NATS__TOKEN", "t0k".into()),
            ],
            vec!["nats.nkey_seed_file", "set together with nats.token"],
        ),
    ];
    for (env, says) in rows {
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let message = load(None, &pairs, &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        for needle in &says {
            assert!(message.contains(needle), "{env:?}: {message}");
        }
        assert!(
            !message.contains("s3cret") && !message.contains(&account[..10]),
            "{message}"
        );
    }
    let c = load(
        None,
        &[("HANDOFF_NATS__NKEY_SEED_FILE", good.as_str())],
        &[],
    )
    .unwrap();
    assert_eq!(
        c.nats.nkey_seed_file.as_deref(),
        Some(pki.file("user.nk").as_path())
    );
    let shown = format!("{c:?}");
    assert!(!shown.contains(&user), "Debug shows the seed");
}

#[test]
fn unknown_tls_keys_are_suggested_in_every_layer() {
    let rows: &[(&str, &str)] = &[
        (
            "[nats.tls]\nca = \"x\"\n",
            "did you mean `nats.tls.ca_file`",
        ),
        ("[etcd.tls]\nrequired = true\n", "etcd.tls.required"),
        ("[nats]\ntls = \"yes\"\n", "expected a table"),
    ];
    for (file, says) in rows {
        let message = load(Some(file), &[], &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(message.contains(says), "{file:?}: {message}");
    }
    let message = load(None, &[("HANDOFF_NATS__TLS__CAFILE", "x")], &[])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(message.contains("HANDOFF_NATS__TLS__CA_FILE"), "{message}");
}

/// The binary: a bad TLS file is exit 2, before the network (the NATS and
/// etcd URLs point at ports where nothing listens; reaching for them would
/// be exit 1).
#[test]
fn a_bad_tls_file_exits_2_before_the_network() {
    let pki = Pki::new();
    let junk = pki.write("junk.pem", "junk\n");
    for (name, value, key) in [
        (
            "HANDOFF_NATS__TLS__CA_FILE",
            junk.as_str(),
            "nats.tls.ca_file",
        ),
        (
            "HANDOFF_ETCD__TLS__CERT_FILE",
            pki.file("client.pem").to_str().unwrap_or_default(),
            "etcd.tls.key_file",
        ),
        (
            "HANDOFF_NATS__NKEY_SEED_FILE",
            "/nonexistent/seed.nk",
            "nats.nkey_seed_file",
        ),
    ] {
        for command in ["run", "setup", "slots"] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
                .arg(command)
                .env(name, value)
                .env("HANDOFF_NATS__URL", "nats://127.0.0.1:1")
                .env("HANDOFF_ETCD__ENDPOINTS", "https://127.0.0.1:1")
                .output()
                .expect("run prefill-handoff");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command} {name}: {stderr}");
            assert!(stderr.contains(key), "{command} {name}: {stderr}");
        }
    }
}

/// The shipped secure example loads once its files exist (here: the test
/// PKI's, through the environment, which beats the file).
#[test]
fn the_secure_example_config_loads() {
    let pki = Pki::new();
    let seed = pki.write("nats.nk", &nkeys::KeyPair::new_user().seed().unwrap());
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client-key.pem"),
    );
    let env = [
        ("HANDOFF_NATS__NKEY_SEED_FILE", seed.as_str()),
        ("HANDOFF_NATS__TLS__CA_FILE", ca.as_str()),
        ("HANDOFF_NATS__TLS__CERT_FILE", cert.as_str()),
        ("HANDOFF_NATS__TLS__KEY_FILE", key.as_str()),
        ("HANDOFF_ETCD__TLS__CA_FILE", ca.as_str()),
        ("HANDOFF_ETCD__TLS__CERT_FILE", cert.as_str()),
        ("HANDOFF_ETCD__TLS__KEY_FILE", key.as_str()),
    ];
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/handoff-secure.toml");
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let c = prefill_handoff::config::Config::load_from(Some(std::path::Path::new(path)), &env, &[])
        .expect("config/handoff-secure.toml loads");
    assert!(c.nats.tls_required() && c.etcd.tls_enabled() && c.nats.nkey_seed_file.is_some());
}
