//! Configuration (contract 2): precedence default < file < environment < flag,
//! errors that name their key, the documented file equal to the defaults, the
//! `id_epoch` parser, and exit code 2 on a bad configuration.

#[path = "config/binary.rs"]
mod binary;
#[path = "config/epoch.rs"]
mod epoch;
#[path = "config/errors.rs"]
mod errors;
#[path = "config/reference.rs"]
mod reference;
#[path = "config/secure.rs"]
mod secure;

use clap::Parser;
use prefill_handoff::cli::load::{JetStreamObjects, LoadError, Loaded};
use prefill_handoff::cli::{Cli, Command};
use prefill_handoff::config::{Config, env_name};
use std::io::Write;
use std::path::Path;

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn toml_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("temp file");
    file.write_all(text.as_bytes()).expect("write temp file");
    file
}

/// Loads with an optional file body, environment pairs and flag overrides,
/// and checks every section as `run` does (no `OTEL_*` variables).
fn load(
    file: Option<&str>,
    env: &[(&str, &str)],
    flags: &[(&str, &str)],
) -> Result<Config, LoadError> {
    let file = file.map(toml_file);
    let config = Config::load_from(file.as_ref().map(|f| f.path()), &owned(env), &owned(flags))?;
    let loaded = Loaded::check(config, JetStreamObjects::WhenJetStreamMode, |_| None)?;
    Ok(loaded.config)
}

fn defaults() -> Config {
    Config::default().resolve().expect("the defaults are valid")
}

fn handoff_toml() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/handoff.toml"))
}

/// A key's value as text, read through the config's serialized form (lists
/// joined with commas), so one table can cover every key.
fn read(config: &Config, key: &str) -> String {
    let mut value = toml::Value::try_from(config).expect("a config serializes");
    for part in key.split('.') {
        value = value
            .get(part)
            .unwrap_or_else(|| panic!("{key} is not in the config"))
            .clone();
    }
    match value {
        toml::Value::String(s) => s,
        toml::Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}

/// One key set in each layer. Columns: key | file (TOML literal -> value read
/// back) | environment | flag; `-> read back` is left out when it equals
/// what was written. Every key is here except the credentials (below).
const PRECEDENCE: &[&str] = &[
    r#"nats.url | "nats://file:4222" -> nats://file:4222 | nats://env:4222 | nats://flag:4222"#,
    r#"nats.name | "file-name" -> file-name | env-name | flag-name"#,
    r#"nats.subscription_capacity | 10 | 20 | 30"#,
    r#"nats.connect_timeout_secs | 11 | 12 | 13"#,
    r#"nats.ping_interval_secs | 21 | 22 | 23"#,
    r#"etcd.endpoints | "http://file:2379" -> http://file:2379 | http://env:2379 | http://flag:2379"#,
    r#"etcd.connect_timeout_ms | 11 | 22 | 33"#,
    r#"etcd.request_timeout_ms | 111 | 222 | 333"#,
    r#"mode | "jetstream" -> jetstream | core | JetStream -> jetstream"#,
    r#"metrics_addr | "127.0.0.1:1001" -> 127.0.0.1:1001 | 127.0.0.1:1002 | [::1]:1003"#,
    r#"shutdown_timeout_secs | 3 | 4 |  5  -> 5"#,
    r#"namespace | "filens" -> filens | envns | flag-ns"#,
    r#"subjects.prefill_results | "file.prefill.>" -> file.prefill.> | env.a,env.b.* | flag.prefill"#,
    r#"subjects.gen | "file.gen" -> file.gen | env.gen | flag.gen"#,
    r#"subjects.dead_letter | "file.dead" -> file.dead | env.dead | flag.dead"#,
    r#"subjects.ids | "file.ids" -> file.ids | env.ids | flag.ids"#,
    r#"subjects.cancel | "file.cancel" -> file.cancel | env.cancel | flag.cancel"#,
    r#"subjects.kv_release | "file.release" -> file.release | env.release | flag.release"#,
    r#"queue_group | "file-q" -> file-q | env-q | flag-q"#,
    r#"jetstream.prefill_stream | "FP" -> FP | EP | XP"#,
    r#"jetstream.gen_stream | "FG" -> FG | EG | XG"#,
    r#"jetstream.cancel_stream | "FC" -> FC | EC | XC"#,
    r#"jetstream.consumer | "fc" -> fc | ec | xc"#,
    r#"jetstream.create | false | TRUE -> true | false"#,
    r#"jetstream.gen_is_stream | false | True -> true | false"#,
    r#"jetstream.ack_wait_secs | 7 | 8 | 9"#,
    r#"jetstream.max_deliver | 5 | -1 | 7"#,
    r#"jetstream.max_ack_pending | 1000 | -1 | 64"#,
    r#"jetstream.nak_delay_ms | 0 | 50 | 60"#,
    r#"jetstream.duplicate_window_secs | 60 | 61 | 62"#,
    r#"jetstream.max_age_secs | 0 | 3600 | 7200"#,
    r#"jetstream.max_bytes | 1000000 | -1 | 2000000"#,
    r#"jetstream.storage | "memory" -> memory | file | memory"#,
    r#"jetstream.batch | 1 | 2 | 3"#,
    r#"jetstream.replicas | 3 | 5 | 2"#,
    r#"id_service.ids_per_sec | 1000 | 2000 | 3000"#,
    r#"id_service.max_count | 16 | 32 | 64"#,
    r#"deadline.clock_skew_ms | 10 | 20 | 30"#,
    r#"trtllm.missing_disagg_request_id | "pass" -> pass | MINT -> mint | refuse"#,
    r#"kv_hold_ms.trtllm | 1000 | 2000 | 3000"#,
    r#"kv_hold_ms.vllm | 480000 | 30000 | 60000"#,
    r#"kv_hold_ms.sglang | 100 | 200 | 300"#,
    r#"kv_hold_ms.opaque | 5 | 6 | 7"#,
    r#"cancel.max_entries | 100 | 200 | 300"#,
    r#"cancel.max_bytes | 10000 | 20000 | 30000"#,
    r#"cancel.retention_secs | 60 | 120 | 180"#,
    r#"allowed_reply_subjects | ["file.>", "_INBOX.>"] -> file.>,_INBOX.> | env.a.>, env.b.* -> env.a.>,env.b.* | flag.>"#,
    r#"lease_ttl_secs | 5 | 6 | 7"#,
    r#"id_layout | "rc21" -> rc21 | rc22 | RC21 -> rc21"#,
    r#"id_epoch | "2024-01-01T00:00:00Z" -> 2024-01-01T00:00:00Z | 2023-01-01T00:00:00Z | 2022-01-01T00:00:00Z"#,
    r#"max_payload_bytes | 2048 | 4096 | 8192"#,
    r#"max_in_flight | 1 | 2 | 3"#,
    r#"max_in_flight_bytes | 2097152 | 3145728 | 4194304"#,
    r#"log_format | "json" -> json | text | json"#,
    r#"nats.tls.required | true | false | true"#,
    r#"nats.tls.first | true | false | true"#,
    r#"otel.sampling_ratio | 0.5 | 0.25 | 0.125"#,
    r#"otel.queue_spans | 16 | 32 | 64"#,
    r#"otel.export_timeout_ms | 100 | 200 | 300"#,
];

const CREDENTIALS: &[&str] = &[
    "nats.user",
    "nats.password",
    "nats.token",
    "nats.credentials_file",
    "etcd.user",
    "etcd.password",
    // Files, read and checked at load: config/secure.rs.
    "nats.nkey_seed_file",
    "nats.tls.ca_file",
    "nats.tls.cert_file",
    "nats.tls.key_file",
    "etcd.tls.ca_file",
    "etcd.tls.cert_file",
    "etcd.tls.key_file",
    // Optional, unset by default: otel_endpoint_and_protocol_across_layers.
    "otel.endpoint",
    "otel.protocol",
];

/// `written -> read back`, or `written` when they are the same.
fn cell(text: &str) -> (&str, &str) {
    match text.split_once(" -> ") {
        Some((written, back)) => (written, back),
        None => (text, text),
    }
}

#[test]
fn flag_beats_environment_beats_file_beats_default() {
    let default = defaults();
    for row in PRECEDENCE {
        let cols: Vec<&str> = row.split(" | ").collect();
        let [key, file, env, flag] = cols[..] else {
            panic!("bad row {row:?}");
        };
        let ((file, file_back), (env, env_back), (flag, flag_back)) =
            (cell(file), cell(env), cell(flag));
        for mask in 0..8u8 {
            let (in_file, in_env, in_flag) = (mask & 1 != 0, mask & 2 != 0, mask & 4 != 0);
            let case = format!("{key} (file {in_file}, env {in_env}, flag {in_flag})");
            let file_text = format!("{key} = {file}\n");
            let env_var = env_name(key);
            let env_pairs = [(env_var.as_str(), env)];
            let flag_pairs = [(key, flag)];
            let config = load(
                in_file.then_some(file_text.as_str()),
                if in_env { &env_pairs } else { &[] },
                if in_flag { &flag_pairs } else { &[] },
            )
            .unwrap_or_else(|e| panic!("{case}: {e}"));
            let want = match (in_file, in_env, in_flag) {
                (_, _, true) => flag_back.to_string(),
                (_, true, false) => env_back.to_string(),
                (true, false, false) => file_back.to_string(),
                (false, false, false) => read(&default, key),
            };
            assert_eq!(read(&config, key), want, "{case}");
        }
        // Each layer must change the value of the one below, or the table
        // could not tell them apart.
        let chain = [
            read(&default, key),
            file_back.into(),
            env_back.into(),
            flag_back.into(),
        ];
        assert!(chain.windows(2).all(|w| w[0] != w[1]), "{key}: {chain:?}");
    }
}

#[test]
fn every_key_has_a_precedence_row_or_a_credentials_test() {
    for key in Config::keys() {
        let has_row = PRECEDENCE
            .iter()
            .any(|row| row.split(" | ").next() == Some(key));
        assert!(
            has_row || CREDENTIALS.contains(&key),
            "{key} has no precedence row"
        );
    }
}

#[test]
fn optional_credentials_are_set_and_unset_across_layers() {
    let file =
        "[nats]\nuser = \"fu\"\npassword = \"fp\"\n[etcd]\nuser = \"eu\"\npassword = \"ep\"\n";
    let c = load(Some(file), &[], &[]).unwrap();
    assert_eq!(c.nats.user.as_deref(), Some("fu"));
    assert_eq!(c.nats.password.as_deref(), Some("fp"));
    assert_eq!(c.etcd.user.as_deref(), Some("eu"));
    assert_eq!(c.etcd.password.as_deref(), Some("ep"));

    // The environment beats the file; an empty value unsets an optional key.
    let env = [("HANDOFF_NATS__USER", ""), ("HANDOFF_NATS__PASSWORD", "")];
    let c = load(Some(file), &env, &[]).unwrap();
    assert_eq!((c.nats.user, c.nats.password), (None, None));
    let env = [("HANDOFF_ETCD__PASSWORD", "env-p")];
    let c = load(Some(file), &env, &[]).unwrap();
    assert_eq!(c.etcd.password.as_deref(), Some("env-p"));

    // A flag beats the environment: the token is unset, user auth set.
    let flags = [
        ("nats.token", ""),
        ("nats.user", "u"),
        ("nats.password", "p"),
    ];
    let c = load(None, &[("HANDOFF_NATS__TOKEN", "t0k")], &flags).unwrap();
    assert_eq!(c.nats.token, None);
    assert_eq!(c.nats.user.as_deref(), Some("u"));
    let c = load(None, &[("HANDOFF_NATS__TOKEN", "t0k")], &[]).unwrap();
    assert_eq!(c.nats.token.as_deref(), Some("t0k"));

    let creds = toml_file("creds");
    let path = creds.path().to_str().unwrap();
    let c = load(None, &[("HANDOFF_NATS__CREDENTIALS_FILE", path)], &[]).unwrap();
    assert_eq!(c.nats.credentials_file.as_deref(), Some(creds.path()));
}

#[test]
fn otel_endpoint_and_protocol_across_layers() {
    let c = load(None, &[], &[]).unwrap();
    assert_eq!(
        (c.otel.endpoint, c.otel.protocol),
        (None, None),
        "off by default"
    );
    let file = "[otel]\nendpoint = \"http://file:4317\"\nprotocol = \"grpc\"\n";
    let c = load(Some(file), &[], &[]).unwrap();
    assert_eq!(c.otel.endpoint.as_deref(), Some("http://file:4317"));
    assert_eq!(c.otel.protocol.as_deref(), Some("grpc"));
    let env = [
        ("HANDOFF_OTEL__ENDPOINT", "http://env:4318"),
        ("HANDOFF_OTEL__PROTOCOL", "http"),
    ];
    let c = load(Some(file), &env, &[]).unwrap();
    assert_eq!(c.otel.endpoint.as_deref(), Some("http://env:4318"));
    assert_eq!(c.otel.protocol.as_deref(), Some("http"));
    // An empty value unsets: tracing off again, whatever the file said.
    let c = load(Some(file), &env, &[("otel.endpoint", "")]).unwrap();
    assert_eq!(c.otel.endpoint, None);
}

#[test]
fn names_follow_the_namespace_unless_pinned() {
    let c = load(None, &[("HANDOFF_NAMESPACE", "prod")], &[]).unwrap();
    let derived = [
        ("subjects.prefill_results", "prod.prefill.results"),
        ("subjects.gen", "prod.gen.jobs"),
        ("subjects.dead_letter", "prod.handoff.dead"),
        ("subjects.ids", "prod.handoff.ids"),
        ("subjects.cancel", "prod.handoff.cancel"),
        ("subjects.kv_release", "prod.kv.release"),
        ("queue_group", "prod-handoff"),
        ("jetstream.prefill_stream", "PROD_PREFILL"),
        ("jetstream.gen_stream", "PROD_GEN"),
        ("jetstream.cancel_stream", "PROD_CANCEL"),
        ("allowed_reply_subjects", "_INBOX.>,prod.replies.>"),
    ];
    for (key, want) in derived {
        assert_eq!(read(&c, key), want, "{key}");
    }

    // The documented file leaves the derived names commented out, so a
    // namespace set on top of it still moves every name.
    let env = owned(&[("HANDOFF_NAMESPACE", "prod")]);
    let c = Config::load_from(Some(handoff_toml()), &env, &[]).unwrap();
    for (key, want) in derived {
        assert_eq!(read(&c, key), want, "{key} with config/handoff.toml");
    }

    let c = load(
        None,
        &[("HANDOFF_NAMESPACE", "prod")],
        &[("subjects.gen", "x.gen")],
    )
    .unwrap();
    assert_eq!(c.subjects.gen_jobs, "x.gen");
    assert_eq!(c.subjects.dead_letter, "prod.handoff.dead");
}

#[test]
fn the_command_line_flags_map_to_their_keys() {
    let argv = "prefill-handoff run --nats-url nats://n:1 --etcd-endpoints http://e:2 \
                --namespace ns1 --mode jetstream --metrics-addr 127.0.0.1:3 \
                --lease-ttl-secs 4 --shutdown-timeout-secs 5 --id-layout rc21 \
                --set subjects.gen=g.jobs --set namespace=loses-to-the-dedicated-flag \
                --set allowed_reply_subjects=a.>,b.>";
    let cli = Cli::try_parse_from(argv.split_whitespace()).unwrap();
    let Command::Run(args) = cli.command else {
        panic!("parsed as run");
    };
    let env = owned(&[
        ("HANDOFF_NAMESPACE", "env-ns"),
        ("HANDOFF_LEASE_TTL_SECS", "99"),
    ]);
    let c = Config::load_from(None, &env, &args.overrides().unwrap()).unwrap();
    let want = [
        ("nats.url", "nats://n:1"),
        ("etcd.endpoints", "http://e:2"),
        ("namespace", "ns1"),
        ("mode", "jetstream"),
        ("metrics_addr", "127.0.0.1:3"),
        ("lease_ttl_secs", "4"),
        ("shutdown_timeout_secs", "5"),
        ("id_layout", "rc21"),
        ("subjects.gen", "g.jobs"),
        ("allowed_reply_subjects", "a.>,b.>"),
    ];
    for (key, value) in want {
        assert_eq!(read(&c, key), value, "{key}");
    }

    let cli = Cli::try_parse_from(["prefill-handoff", "setup", "--set", "no-equals-sign"]).unwrap();
    let Command::Setup(args) = cli.command else {
        panic!("parsed as setup");
    };
    let e = args.overrides().unwrap_err().to_string();
    assert!(e.contains("--set") && e.contains("KEY=VALUE"), "{e}");
}

#[test]
fn the_harness_variables_are_not_configuration() {
    let env = [
        ("HANDOFF_TEST_NATS_SERVER", "/usr/sbin/nats-server"),
        ("HANDOFF_TEST_ANYTHING", "x"),
        ("PATH", "/bin"),
        ("NATS_URL", "nats://ignored:1"),
    ];
    assert_eq!(load(None, &env, &[]).unwrap(), defaults());
}

#[test]
fn the_documented_file_equals_the_defaults() {
    let from_file = Config::load_from(Some(handoff_toml()), &[], &[]).unwrap();
    assert_eq!(from_file, defaults());
}

#[test]
fn the_documented_file_mentions_every_key() {
    let text = std::fs::read_to_string(handoff_toml()).unwrap();
    let mut section = String::new();
    let mut found = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
        } else if let Some((name, _)) = line.trim_start_matches(['#', ' ']).split_once(" = ")
            && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        {
            found.push(match section.as_str() {
                "" => name.to_string(),
                s => format!("{s}.{name}"),
            });
        }
    }
    for key in Config::keys() {
        assert!(
            found.iter().any(|f| f == key),
            "config/handoff.toml does not document {key}"
        );
    }
}
