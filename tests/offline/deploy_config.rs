//! The deployment kit in `deploy/` says what the worker accepts: the
//! Kubernetes base's `handoff.toml` loads, every `HANDOFF_*` variable the
//! manifests and the systemd drop-in set names a configuration key, and the
//! DaemonSet and the systemd unit outlast the worker's whole shutdown (drain,
//! span flush, lease revoke). The rendered manifests, the alert rules and the
//! unit are checked by the platform tools in `scripts/check-deploy.sh`.

use prefill_handoff::config::{Config, Mode};

const DAEMONSET: &str = include_str!("../../deploy/kubernetes/base/daemonset.yaml");
const SETUP_JOB: &str = include_str!("../../deploy/kubernetes/base/setup-job.yaml");
const BASE_TOML: &str = include_str!("../../deploy/kubernetes/base/handoff.toml");
const TLS_PATCHES: [&str; 2] = [
    include_str!("../../deploy/kubernetes/overlays/tls/daemonset-tls.yaml"),
    include_str!("../../deploy/kubernetes/overlays/tls/setup-job-tls.yaml"),
];
const UNIT: &str = include_str!("../../deploy/systemd/prefill-handoff.service");
const UNIT_TLS: &str = include_str!("../../deploy/systemd/prefill-handoff.service.d/tls.conf");
const KIT_README: &str = include_str!("../../deploy/README.md");
const CONFIG_PATH: &str = "/etc/prefill-handoff/handoff.toml";

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

fn base_config() -> Config {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("handoff.toml");
    std::fs::write(&path, BASE_TOML).expect("write");
    Config::load_from(Some(&path), &[], &[]).expect("the base's handoff.toml loads")
}

/// Seconds from SIGTERM to exit at the most (docs/operations.md, "Shutdown
/// timing"): the drain deadline, the NATS flush (1 s at least), the last
/// OTLP export, the ID floor write and lease revoke (2 etcd requests + 1 s),
/// and 1 s to stop.
fn shutdown_bound_secs(config: &Config) -> u64 {
    config.shutdown_timeout_secs
        + 1
        + config.otel.export_timeout_ms.div_ceil(1000)
        + 2 * config.etcd.request_timeout_ms.div_ceil(1000)
        + 1
        + 1
}

/// Every `HANDOFF_*` name in `text` (env `- name:` entries, `Environment=`).
fn env_names(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("HANDOFF_") && !w.ends_with('_'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_base_config_loads_and_fits_its_probes_and_grace_period() {
    let config = base_config();
    assert_eq!(config.mode, Mode::Jetstream);
    assert!(
        !config.jetstream.create,
        "the setup Job creates the streams; workers run least-privileged"
    );
    assert!(
        config.metrics_addr.starts_with("0.0.0.0:"),
        "probes reach the pod IP: {}",
        config.metrics_addr
    );
    let port = config.metrics_addr.rsplit(':').next().unwrap_or_default();
    assert!(DAEMONSET.contains(&format!("containerPort: {port}")));
    let grace = number_after(DAEMONSET, "terminationGracePeriodSeconds:");
    let bound = shutdown_bound_secs(&config);
    assert!(
        grace > bound,
        "{grace} s grace, shutdown takes up to {bound} s"
    );
    for manifest in [DAEMONSET, SETUP_JOB] {
        assert!(manifest.contains(&format!(
            "mountPath: {}",
            CONFIG_PATH.trim_end_matches("/handoff.toml")
        )));
        assert!(manifest.contains(&format!("\"--config\", \"{CONFIG_PATH}\"")));
    }
    assert!(SETUP_JOB.contains("args: [\"setup\""));
    for probe in ["path: /readyz", "path: /healthz"] {
        assert!(DAEMONSET.contains(probe), "{probe}");
    }
}

#[test]
fn every_handoff_variable_of_the_kit_names_a_configuration_key() {
    let texts = [
        DAEMONSET,
        SETUP_JOB,
        TLS_PATCHES[0],
        TLS_PATCHES[1],
        UNIT,
        UNIT_TLS,
    ];
    let names: Vec<String> = texts.iter().flat_map(|t| env_names(t)).collect();
    assert!(names.len() >= 8, "{names:?}");
    for name in names {
        // The value may be refused (a file that is not there); the name
        // must not be.
        let env = [(name.clone(), "1".to_owned())];
        if let Err(err) = Config::load_from(None, &env, &[]) {
            assert!(
                !err.to_string().contains("unknown configuration key"),
                "{name}: {err}"
            );
        }
    }
    let unknown = [("HANDOFF_NATS__TLS__KEYFILE".to_owned(), "x".to_owned())];
    let err = Config::load_from(None, &unknown, &[]).expect_err("an unknown name is refused");
    assert!(
        err.to_string().contains("unknown configuration key"),
        "{err}"
    );
}

#[test]
fn the_systemd_unit_restarts_through_a_slow_boot_and_outlasts_the_shutdown() {
    assert!(UNIT.contains(&format!(
        "ExecStart=/usr/local/bin/prefill-handoff run --config {CONFIG_PATH}"
    )));
    assert!(UNIT.contains("KillSignal=SIGTERM"));
    // The worker exits on its own when it cannot work (NATS or etcd down at
    // start, a panic, NATS connection gone); it must always come back, exit
    // code 2 aside, however long NATS and etcd take to come up.
    assert!(UNIT.contains("\nRestart=always\n"));
    assert!(UNIT.contains("RestartPreventExitStatus=2"));
    assert!(UNIT.contains("\nStartLimitIntervalSec=0\n"));
    assert!(number_after(UNIT, "RestartSec=") >= 1);
    assert!(DAEMONSET.contains("restartPolicy: Always"));
    let stop = number_after(UNIT, "TimeoutStopSec=");
    let bound = shutdown_bound_secs(&Config::default());
    assert!(stop > bound, "{stop} s, shutdown takes up to {bound} s");
}

#[test]
fn the_units_key_material_comes_from_credentials_and_its_documentation_exists() {
    assert!(UNIT.contains("DynamicUser=yes"));
    for line in UNIT_TLS.lines().filter(|l| l.starts_with("Environment=")) {
        assert!(
            line.contains("=%d/"),
            "not from $CREDENTIALS_DIRECTORY: {line}"
        );
        let file = line.rsplit('/').next().unwrap_or_default();
        assert!(
            UNIT_TLS.contains(&format!("LoadCredential={file}:")),
            "{file} is not loaded"
        );
    }
    // Each Documentation= file is installed from the repository by the
    // unit's install lines.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for doc in UNIT
        .lines()
        .filter_map(|l| l.strip_prefix("Documentation=file://"))
    {
        let line = UNIT
            .lines()
            .find(|l| l.starts_with("#   install") && l.ends_with(doc))
            .unwrap_or_else(|| panic!("no install line for {doc}"));
        let source = line.split_whitespace().rev().nth(1).unwrap_or_default();
        assert!(root.join(source).is_file(), "{source} (for {doc})");
    }
}

/// Every memory limit of the kit (the DaemonSet's request and limit, the
/// unit's `MemoryHigh` and `MemoryMax`) is at least the hostile burst's
/// measured peak RSS, as `deploy/README.md` ("Memory") gives it, plus half.
#[test]
fn the_memory_limits_hold_the_measured_peak_with_headroom() {
    let peak_mib = number_after(KIT_README, "| hostile burst, measured peak RSS");
    let wanted_mib = peak_mib + peak_mib / 2;
    let mut limits: Vec<(String, u64)> = DAEMONSET
        .lines()
        .filter(|l| l.trim_start().starts_with("memory:"))
        .map(|l| (l.trim().to_string(), number_after(l, "memory:")))
        .collect();
    assert!(
        DAEMONSET
            .lines()
            .all(|l| !l.trim_start().starts_with("memory:") || l.trim_end().ends_with("Mi")),
        "the DaemonSet's memory is given in Mi"
    );
    assert_eq!(limits.len(), 2, "a request and a limit: {limits:?}");
    for key in ["MemoryHigh=", "MemoryMax="] {
        let line = UNIT
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key}"));
        assert!(
            line.ends_with('M'),
            "{line}: the unit's memory is given in M"
        );
        limits.push((line.to_string(), number_after(UNIT, key)));
    }
    for (line, mib) in limits {
        assert!(
            mib >= wanted_mib,
            "{line}: below the measured peak of {peak_mib} MiB plus half ({wanted_mib} MiB)"
        );
    }
}
