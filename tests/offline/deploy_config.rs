//! The deployment examples in `config/` say what the worker accepts: the
//! DaemonSet's embedded `handoff.toml` loads, and both the systemd unit and
//! the DaemonSet point at the documented config path and outlast the
//! shutdown timeout.

use prefill_handoff::config::{Config, Mode};

const DAEMONSET: &str = include_str!("../../config/daemonset.yaml");
const UNIT: &str = include_str!("../../config/prefill-handoff.service");
const CONFIG_PATH: &str = "/etc/prefill-handoff/handoff.toml";

/// The block under `handoff.toml: |` in the ConfigMap, dedented.
fn embedded_toml() -> String {
    let mut lines = DAEMONSET
        .lines()
        .skip_while(|l| l.trim() != "handoff.toml: |");
    assert!(lines.next().is_some(), "the ConfigMap has no handoff.toml");
    lines
        .take_while(|l| l.trim() != "---")
        .map(|l| l.strip_prefix("    ").unwrap_or(l.trim()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The integer after `key` on the first line that holds it.
fn number_after(text: &str, key: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(key))
        .unwrap_or_else(|| panic!("no {key}"));
    let digits: String = line[line.find(key).map_or(0, |i| i + key.len())..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number in {line:?}"))
}

#[test]
fn the_daemonset_config_loads_and_fits_its_probes_and_grace_period() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("handoff.toml");
    std::fs::write(&path, embedded_toml()).expect("write");
    let config =
        Config::load_from(Some(&path), &[], &[]).expect("the ConfigMap's handoff.toml loads");
    assert_eq!(config.mode, Mode::Core);
    assert!(
        config.metrics_addr.starts_with("0.0.0.0:"),
        "probes reach the pod IP: {}",
        config.metrics_addr
    );
    let port = config.metrics_addr.rsplit(':').next().unwrap_or_default();
    assert!(DAEMONSET.contains(&format!("containerPort: {port}")));
    let grace = number_after(DAEMONSET, "terminationGracePeriodSeconds:");
    assert!(grace > config.shutdown_timeout_secs, "{grace} s grace");
    assert!(DAEMONSET.contains(&format!(
        "mountPath: {}",
        CONFIG_PATH.trim_end_matches("/handoff.toml")
    )));
    assert!(DAEMONSET.contains(&format!("\"--config\", \"{CONFIG_PATH}\"")));
    for probe in ["path: /readyz", "path: /healthz"] {
        assert!(DAEMONSET.contains(probe), "{probe}");
    }
}

#[test]
fn the_systemd_unit_runs_the_documented_config_and_outlasts_the_shutdown_timeout() {
    assert!(UNIT.contains(&format!(
        "ExecStart=/usr/local/bin/prefill-handoff run --config {CONFIG_PATH}"
    )));
    assert!(UNIT.contains("KillSignal=SIGTERM"));
    // The worker exits on its own when it cannot work (panic, NATS
    // connection gone); it must always come back, exit code 2 aside.
    assert!(UNIT.contains("\nRestart=always\n"));
    assert!(UNIT.contains("RestartPreventExitStatus=2"));
    assert!(DAEMONSET.contains("restartPolicy: Always"));
    let stop = number_after(UNIT, "TimeoutStopSec=");
    assert!(stop > Config::default().shutdown_timeout_secs, "{stop} s");
}
