//! The binary loads its configuration before anything else and exits 2 when
//! it is bad (contract 8).

use super::{handoff_toml, toml_file};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs the binary with no `HANDOFF_*` variable but the given ones; its exit
/// code (None: killed after 10 s, still running) and stderr.
fn binary(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prefill-handoff"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("HANDOFF_") {
            cmd.env_remove(name);
        }
    }
    let log = tempfile::NamedTempFile::new().expect("temp file");
    let mut child = cmd
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().expect("reopen temp file"))
        .spawn()
        .expect("run prefill-handoff");
    let deadline = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        code,
        std::fs::read_to_string(log.path()).unwrap_or_default(),
    )
}

/// Arguments, environment, and what stderr must name.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn the_binary_exits_2_on_a_bad_configuration() {
    let bad = toml_file("lease_ttl_secs = 1\n");
    let unknown = toml_file("[nats]\nurls = \"nats://x\"\n");
    let (bad, unknown) = (
        bad.path().to_str().unwrap(),
        unknown.path().to_str().unwrap(),
    );
    let cases: &[Case] = &[
        (&["setup", "--config", bad], &[], "lease_ttl_secs"),
        (&["run", "--config", bad], &[], "lease_ttl_secs"),
        (&["run", "--config", unknown], &[], "nats.urls"),
        (
            &["run", "--config", "/nonexistent/h.toml"],
            &[],
            "/nonexistent/h.toml",
        ),
        (&["run"], &[("HANDOFF_MODE", "durable")], "mode"),
        (
            &["setup"],
            &[("HANDOFF_NO_SUCH_KEY", "1")],
            "HANDOFF_NO_SUCH_KEY",
        ),
        (&["run", "--lease-ttl-secs", "abc"], &[], "lease_ttl_secs"),
        (&["run", "--set", "nope=1"], &[], "nope"),
        (&["run", "--set", "nope"], &[], "--set"),
        // A flag for another key does not hide a bad environment value.
        (
            &["run", "--mode", "core"],
            &[("HANDOFF_LEASE_TTL_SECS", "x")],
            "lease_ttl_secs",
        ), // What the JetStream objects cannot be, refused before etcd or NATS
        // is contacted: in JetStream mode for `run`, always for `setup`.
        (
            &[
                "run",
                "--mode",
                "jetstream",
                "--set",
                "jetstream.max_deliver=-1",
            ],
            &[],
            "jetstream.max_deliver",
        ),
        (
            &["setup", "--set", "jetstream.max_age_secs=600"],
            &[],
            "jetstream.duplicate_window_secs",
        ),
        // A standard OTEL_* variable the exporter cannot use.
        (
            &["run"],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ],
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
    ];
    for (args, env, key) in cases {
        let (code, stderr) = binary(args, env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains(key),
            "{args:?} {env:?}: {stderr:?} lacks {key:?}"
        );
    }
}

#[test]
fn a_good_configuration_gets_past_loading() {
    // Loading succeeds, so whatever `setup` does next (fail to connect, or
    // keep trying until killed), it does not exit with the config code 2.
    let file = handoff_toml().to_str().unwrap();
    let args = [
        "setup",
        "--config",
        file,
        "--nats-url",
        "nats://127.0.0.1:1",
    ];
    let (code, stderr) = binary(&args, &[("HANDOFF_TEST_IGNORED", "1")]);
    assert_ne!(code, Some(2), "{stderr}");
    assert_ne!(code, Some(0), "nothing listens on port 1: {stderr}");
}
