//! Bad configurations: every message names its key, says what was expected,
//! and never shows a secret.

use super::{load, toml_file};
use prefill_handoff::config::Config;
use std::path::Path;

/// Columns: layer | setting | the message contains (`;`-separated, the key
/// first) | the message never contains (optional). Settings: `file` is the
/// file's body (`\n` for a new line); `env` and `flag` are `NAME=value`
/// pairs joined by ` & `.
const BAD: &[&str] = &[
    // Unknown keys, in every layer, with a suggestion.
    r#"file | [nats]\nurls = "x" | nats.urls ; did you mean `nats.url`"#,
    r#"file | lease_ttl = 5 | lease_ttl ; did you mean `lease_ttl_secs`"#,
    r#"file | [subjects]\ngen_jobs = "a.b" | subjects.gen_jobs ; did you mean `subjects.gen`"#,
    r#"file | [nope]\nx = 1 | nope ; unknown"#,
    r#"file | nats = "nats://x" | nats ; expected a table"#,
    r#"env | HANDOFF_NATS__URLS=x | nats.urls ; HANDOFF_NATS__URLS ; did you mean HANDOFF_NATS__URL"#,
    r#"env | HANDOFF_LEASE_TTL=5 | lease_ttl ; HANDOFF_LEASE_TTL_SECS"#,
    r#"env | HANDOFF_nats__url=x | nats.url ; HANDOFF_nats__url ; upper case ; HANDOFF_NATS__URL"#,
    r#"env | HANDOFF_CONFIG=/etc/x.toml | config ; HANDOFF_CONFIG ; unknown"#,
    r#"flag | nats.urls=x | nats.urls ; --set ; did you mean `nats.url`"#,
    // Values of the wrong type, converted by the field's type.
    r#"file | lease_ttl_secs = "ten" | lease_ttl_secs ; config file ; non-negative integer ; "ten""#,
    r#"file | lease_ttl_secs = 1.5 | lease_ttl_secs ; float"#,
    r#"file | max_in_flight = -3 | max_in_flight ; non-negative integer"#,
    r#"file | mode = "fast" | mode ; "core", "jetstream""#,
    r#"file | id_epoch = 2025-01-01T00:00:00Z | id_epoch ; datetime ; quote it"#,
    r#"file | allowed_reply_subjects = [1, 2] | allowed_reply_subjects ; list of strings"#,
    r#"file | [jetstream]\ncreate = "yes" | jetstream.create ; true or false"#,
    r#"file | this is not toml | config file ; line 1 ; not valid TOML"#,
    r#"env | HANDOFF_LEASE_TTL_SECS=abc | lease_ttl_secs ; from HANDOFF_LEASE_TTL_SECS ; non-negative integer"#,
    r#"env | HANDOFF_MAX_PAYLOAD_BYTES=-5 | max_payload_bytes ; non-negative integer"#,
    r#"env | HANDOFF_SHUTDOWN_TIMEOUT_SECS=99999999999999999999 | shutdown_timeout_secs ; non-negative integer"#,
    r#"env | HANDOFF_MODE=durable | mode ; "core", "jetstream""#,
    r#"env | HANDOFF_ID_LAYOUT=rc23 | id_layout ; "rc21", "rc22""#,
    r#"env | HANDOFF_JETSTREAM__CREATE=maybe | jetstream.create ; true or false"#,
    r#"env | HANDOFF_JETSTREAM__MAX_DELIVER=1.5 | jetstream.max_deliver ; an integer"#,
    r#"env | HANDOFF_LOG_FORMAT=xml | log_format ; "text", "json""#,
    r#"flag | jetstream.storage=disk | jetstream.storage ; "file", "memory" ; command line"#,
    r#"flag | lease_ttl_secs= | lease_ttl_secs ; non-negative integer"#,
    r#"env | HANDOFF_OTEL__SAMPLING_RATIO=half | otel.sampling_ratio ; a number"#,
    r#"file | [otel]\nsampling_ratio = "0.5" | otel.sampling_ratio ; a number"#,
    // Values of the right type that cannot work.
    r#"env | HANDOFF_OTEL__ENDPOINT=collector:4317 | otel.endpoint ; http://host:port"#,
    r#"env | HANDOFF_OTEL__ENDPOINT=ftp://u:secret@c:4317 | otel.endpoint ; http://host:port | secret"#,
    r#"env | HANDOFF_OTEL__ENDPOINT=https://c:4317 | otel.endpoint ; TLS to the collector is not supported"#,
    r#"env | HANDOFF_OTEL__PROTOCOL=http/json | otel.protocol ; "grpc", "http""#,
    r#"env | HANDOFF_OTEL__SAMPLING_RATIO=1.5 | otel.sampling_ratio ; from 0"#,
    r#"env | HANDOFF_OTEL__SAMPLING_RATIO=-0.1 | otel.sampling_ratio ; from 0"#,
    r#"env | HANDOFF_OTEL__QUEUE_SPANS=0 | otel.queue_spans ; 1 to 1000000"#,
    r#"env | HANDOFF_OTEL__EXPORT_TIMEOUT_MS=0 | otel.export_timeout_ms ; at least 1"#,
    r#"env | HANDOFF_NAMESPACE= | namespace ; non-empty"#,
    r#"env | HANDOFF_NAMESPACE=a.b | namespace ; "a.b""#,
    r#"env | HANDOFF_NAMESPACE=a b | namespace"#,
    r#"env | HANDOFF_NAMESPACE=a> | namespace"#,
    r#"env | HANDOFF_SUBJECTS__PREFILL_RESULTS=a..b | subjects.prefill_results ; "a..b""#,
    r#"env | HANDOFF_SUBJECTS__PREFILL_RESULTS=a.>.b | subjects.prefill_results"#,
    r#"env | HANDOFF_SUBJECTS__PREFILL_RESULTS= , | subjects.prefill_results ; no subject"#,
    r#"env | HANDOFF_SUBJECTS__GEN=llm.gen.* | subjects.gen ; without wildcards"#,
    r#"env | HANDOFF_SUBJECTS__DEAD_LETTER=llm dead | subjects.dead_letter"#,
    r#"env | HANDOFF_SUBJECTS__GEN=llm.prefill.results | subjects.gen ; its own output"#,
    r#"env | HANDOFF_SUBJECTS__PREFILL_RESULTS=llm.> | subjects.gen ; "llm.>" ; its own output"#,
    r#"env | HANDOFF_SUBJECTS__IDS=llm.gen.jobs | subjects.ids ; also subjects.gen"#,
    r#"env | HANDOFF_QUEUE_GROUP=a b | queue_group"#,
    r#"env | HANDOFF_JETSTREAM__GEN_STREAM=a.b | jetstream.gen_stream ; not a JetStream name"#,
    r#"env | HANDOFF_JETSTREAM__CONSUMER= | jetstream.consumer"#,
    r#"env | HANDOFF_JETSTREAM__GEN_STREAM=LLM_PREFILL | jetstream.gen_stream ; separate streams"#,
    r#"env | HANDOFF_ALLOWED_REPLY_SUBJECTS=_INBOX.>,a..b | allowed_reply_subjects ; "a..b""#,
    r#"env | HANDOFF_METRICS_ADDR=localhost:9464 | metrics_addr ; IP:PORT"#,
    r#"env | HANDOFF_METRICS_ADDR=127.0.0.1 | metrics_addr"#,
    r#"env | HANDOFF_NATS__URL= | nats.url"#,
    r#"env | HANDOFF_NATS__URL=nats://a:4222,,nats://b:4222 | nats.url"#,
    r#"env | HANDOFF_ETCD__ENDPOINTS=http://a:2379, | etcd.endpoints"#,
    r#"env | HANDOFF_LEASE_TTL_SECS=1 | lease_ttl_secs ; 2 to 9000000000 ; TTL/3 ; etcd"#,
    r#"env | HANDOFF_LEASE_TTL_SECS=0 | lease_ttl_secs ; 2 to 9000000000"#,
    r#"env | HANDOFF_SHUTDOWN_TIMEOUT_SECS=0 | shutdown_timeout_secs ; at least 1"#,
    r#"env | HANDOFF_MAX_PAYLOAD_BYTES=1023 | max_payload_bytes ; at least 1024"#,
    r#"env | HANDOFF_MAX_IN_FLIGHT=0 | max_in_flight ; at least 1"#,
    r#"env | HANDOFF_NATS__SUBSCRIPTION_CAPACITY=0 | nats.subscription_capacity ; at least 1"#,
    r#"env | HANDOFF_MAX_IN_FLIGHT_BYTES=1000 | max_in_flight_bytes ; smaller than max_payload_bytes"#,
    r#"env | HANDOFF_MAX_IN_FLIGHT_BYTES=4294967296 | max_in_flight_bytes ; 1 to 4294967295"#,
    r#"env | HANDOFF_ETCD__CONNECT_TIMEOUT_MS=0 | etcd.connect_timeout_ms ; at least 1"#,
    r#"env | HANDOFF_ETCD__REQUEST_TIMEOUT_MS=0 | etcd.request_timeout_ms ; at least 1"#,
    r#"env | HANDOFF_JETSTREAM__ACK_WAIT_SECS=0 | jetstream.ack_wait_secs ; at least 1"#,
    r#"env | HANDOFF_JETSTREAM__DUPLICATE_WINDOW_SECS=0 | jetstream.duplicate_window_secs ; at least 1"#,
    r#"env | HANDOFF_JETSTREAM__BATCH=0 | jetstream.batch ; at least 1"#,
    r#"env | HANDOFF_JETSTREAM__MAX_DELIVER=0 | jetstream.max_deliver ; -1 (unlimited)"#,
    r#"env | HANDOFF_JETSTREAM__REPLICAS=0 | jetstream.replicas ; 1 to 5"#,
    r#"env | HANDOFF_JETSTREAM__REPLICAS=6 | jetstream.replicas ; 1 to 5"#,
    r#"env | HANDOFF_JETSTREAM__MAX_ACK_PENDING=-7 | jetstream.max_ack_pending ; -1 (unlimited)"#,
    r#"env | HANDOFF_JETSTREAM__MAX_BYTES=-2 | jetstream.max_bytes ; -1 (unlimited)"#,
    r#"env | HANDOFF_JETSTREAM__MAX_AGE_SECS=60 | jetstream.duplicate_window_secs ; max_age_secs"#,
    r#"env | HANDOFF_ID_EPOCH=2025-13-01T00:00:00Z | id_epoch ; RFC 3339 ; month 13"#,
    r#"env | HANDOFF_ID_EPOCH=2023-02-29T00:00:00Z | id_epoch ; no day 29"#,
    r#"env | HANDOFF_ID_EPOCH=2025-01-01T00:00:00+02:00 | id_epoch ; UTC"#,
    r#"env | HANDOFF_ID_EPOCH=2025-01-01T00:00:00 | id_epoch ; RFC 3339"#,
    r#"env | HANDOFF_ID_EPOCH=2025-01-01 | id_epoch ; RFC 3339"#,
    r#"env | HANDOFF_ID_EPOCH=1969-12-31T23:59:59Z | id_epoch ; 1970"#,
    r#"env | HANDOFF_ID_EPOCH=2016-12-31T23:59:60Z | id_epoch ; leap second"#,
    r#"env | HANDOFF_ID_EPOCH=9999-01-01T00:00:00Z | id_epoch ; in the future"#,
    // Authentication that cannot work, without showing the secret.
    r#"env | HANDOFF_NATS__USER=alice | nats.password ; nats.user ; needs both"#,
    r#"env | HANDOFF_NATS__PASSWORD=hunter2 | nats.user ; needs both | hunter2"#,
    r#"env | HANDOFF_NATS__TOKEN=s3cr3t-t0ken & HANDOFF_NATS__USER=a & HANDOFF_NATS__PASSWORD=hunter2 | nats.token ; one NATS authentication method | s3cr3t-t0ken ; hunter2"#,
    r#"env | HANDOFF_NATS__CREDENTIALS_FILE=/nonexistent/nats.creds | nats.credentials_file ; /nonexistent/nats.creds"#,
    r#"env | HANDOFF_ETCD__PASSWORD=hunter2 | etcd.user ; needs both | hunter2"#,
    r#"env | HANDOFF_ETCD__USER=root | etcd.password ; needs both"#,
    r#"file | [nats]\npassword = 31415926 | nats.password ; secret | 31415926"#,
    r#"file | [nats]\npassword = "unterminated-s3cret | config file ; line 2 | unterminated-s3cret"#,
    r#"env | HANDOFF_NATS__URL=nats://u:hunter2@h:4222,,x | nats.url ; u:<redacted>@h | hunter2"#,
    // Credentials in the URL are one authentication method, the same in every URL.
    r#"env | HANDOFF_NATS__URL=nats://u:hunter2@h:4222 & HANDOFF_NATS__USER=a & HANDOFF_NATS__PASSWORD=pw2 | nats.url ; holds credentials ; nats.user/nats.password ; one NATS authentication method | hunter2 ; pw2"#,
    r#"env | HANDOFF_NATS__URL=nats://s3cr3t-t0ken@h:4222 & HANDOFF_NATS__TOKEN=t2 | nats.url ; nats.token | s3cr3t-t0ken"#,
    r#"env | HANDOFF_NATS__URL=nats://u:hunter2@a:4222,nats://u:0th3r-pw@b:4222 | nats.url ; differ ; u:<redacted>@b | hunter2 ; 0th3r-pw"#,
    r#"env | HANDOFF_NATS__URL=nats://u:hunter2@a:notaport | nats.url ; u:<redacted>@a | hunter2"#,
    r#"env | HANDOFF_NATS__URL=http://a:4222 | nats.url ; scheme"#,
    // The ID service's budget.
    r#"env | HANDOFF_ID_SERVICE__IDS_PER_SEC=0 | id_service.ids_per_sec ; 1 to 512000"#,
    r#"env | HANDOFF_ID_SERVICE__IDS_PER_SEC=512001 | id_service.ids_per_sec ; 1 to 512000 ; decode jobs"#,
    r#"env | HANDOFF_ID_SERVICE__MAX_COUNT=0 | id_service.max_count ; 1 to 1024"#,
    r#"env | HANDOFF_ID_SERVICE__MAX_COUNT=1025 | id_service.max_count ; 1 to 1024"#,
    r#"env | HANDOFF_NATS__CONNECT_TIMEOUT_SECS=0 | nats.connect_timeout_secs ; at least 1"#,
    r#"env | HANDOFF_NATS__PING_INTERVAL_SECS=0 | nats.ping_interval_secs ; at least 1"#,
    r#"env | HANDOFF_LEASE_TTL_SECS=9000000001 | lease_ttl_secs ; 2 to 9000000000"#,
    // What `setup` would refuse, refused at load in JetStream mode.
    r#"env | HANDOFF_MODE=jetstream & HANDOFF_JETSTREAM__MAX_DELIVER=-1 | jetstream.max_deliver ; -1 (unlimited) ; gen_is_stream"#,
    r#"env | HANDOFF_MODE=jetstream & HANDOFF_JETSTREAM__MAX_AGE_SECS=600 | jetstream.duplicate_window_secs ; 1079 s ; max_age_secs (600)"#,
];

fn pairs(text: &str) -> Vec<(&str, &str)> {
    text.split(" & ")
        .map(|p| {
            p.split_once('=')
                .unwrap_or_else(|| panic!("{p:?}: NAME=value"))
        })
        .collect()
}

#[test]
fn every_error_names_its_key() {
    for row in BAD {
        let cols: Vec<&str> = row.split(" | ").collect();
        let (layer, setting, must, never) = match cols[..] {
            [l, s, m] => (l, s, m, ""),
            [l, s, m, n] => (l, s, m, n),
            _ => panic!("bad row {row:?}"),
        };
        let body = setting.replace("\\n", "\n") + "\n";
        let result = match layer {
            "file" => load(Some(&body), &[], &[]),
            "env" => load(None, &pairs(setting), &[]),
            "flag" => load(None, &[], &pairs(setting)),
            other => panic!("unknown layer {other:?}"),
        };
        let message = match result {
            Ok(_) => panic!("{row}: accepted"),
            Err(e) => e.to_string(),
        };
        for needle in must.split(" ; ") {
            assert!(
                message.contains(needle),
                "{row}\n{message:?} lacks {needle:?}"
            );
        }
        for secret in never.split(" ; ").filter(|s| !s.is_empty()) {
            assert!(
                !message.contains(secret),
                "{row}\n{message:?} shows a secret"
            );
        }
    }
}

#[test]
fn a_missing_config_file_is_an_error_naming_it() {
    let e = Config::load_from(Some(Path::new("/nonexistent/handoff.toml")), &[], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/handoff.toml"), "{e}");
}

#[test]
fn a_later_setting_of_the_same_key_wins_within_a_layer() {
    let c = load(
        None,
        &[],
        &[("lease_ttl_secs", "5"), ("lease_ttl_secs", "6")],
    )
    .unwrap();
    assert_eq!(c.lease_ttl_secs, 6);
    let file = toml_file("lease_ttl_secs = 5\n");
    let c = Config::load_from(Some(file.path()), &[], &[]).unwrap();
    assert_eq!(c.lease_ttl_secs, 5);
}

#[test]
fn debug_output_hides_secrets() {
    let env = [
        ("HANDOFF_NATS__USER", "alice"),
        ("HANDOFF_NATS__PASSWORD", "hunter2"),
        ("HANDOFF_ETCD__ENDPOINTS", "http://root:etcd-s3cret@e:2379"),
        ("HANDOFF_ETCD__USER", "root"),
        ("HANDOFF_ETCD__PASSWORD", "etcd-s3cret"),
    ];
    // Credentials in the NATS URL are an authentication method of their
    // own, so they are loaded apart from nats.user/nats.password.
    let in_url = [("HANDOFF_NATS__URL", "nats://alice:url-s3cret@h:4222")];
    for c in [
        load(None, &env, &[]).unwrap(),
        load(None, &in_url, &[]).unwrap(),
    ] {
        let shown = format!("{c:?} {c:#?}");
        for secret in ["hunter2", "etcd-s3cret", "url-s3cret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(
            shown.contains("alice") && shown.contains("<redacted>"),
            "{shown}"
        );
    }

    let c = load(None, &[("HANDOFF_NATS__TOKEN", "t0ken-value")], &[]).unwrap();
    assert!(!format!("{c:?}").contains("t0ken-value"));
    // The values themselves stay intact for the code that connects.
    assert_eq!(c.nats.token.as_deref(), Some("t0ken-value"));
    assert_eq!(
        load(None, &env, &[]).unwrap().nats.password.as_deref(),
        Some("hunter2")
    );
}
