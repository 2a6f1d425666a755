//! Supervision (issue 9): a worker that can no longer work exits non-zero so
//! systemd (`Restart=always`) or Kubernetes restarts it.
//!
//! The failures are injected through `PREFILL_HANDOFF_DEBUG_FAULT`, which debug
//! builds only (the tests' binary) act on when sent SIGUSR1 (src/cli/
//! supervise.rs). With the patched client nothing a server sends ends the
//! connection task for good (every protocol error is a reconnect, and
//! reconnects never stop), so a fake server could reach that state only
//! through one of the panics just removed; the hook drains the client instead,
//! which ends the same task the same way any other cause would.

use crate::common;

use common::{Etcd, Nats, Worker, http_send, poll_until_blocking};
use std::time::{Duration, Instant};

/// Generous: the exit itself takes about a second (the lease revoke is
/// bounded by twice etcd.request_timeout_ms plus a second).
const EXIT: Duration = Duration::from_secs(20);

/// `run` in `mode` with `fault` armed; returns once `/readyz` says ready.
fn spawn_ready(nats: &Nats, etcd: &Etcd, mode: &str, fault: &str) -> (Worker, String) {
    let settings = ["jetstream.create=true", "etcd.request_timeout_ms=1000"];
    Worker::run_ready(
        nats,
        etcd,
        mode,
        &settings,
        &[("PREFILL_HANDOFF_DEBUG_FAULT", fault)],
    )
}

/// Ends the client's connection task in a ready worker; checks that
/// `/readyz` answers 503 (NATS not connected) from then until the process
/// exits, and that it exits 1.
fn connection_end_makes_the_worker_unready_and_exit_non_zero(mode: &str) {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let (mut worker, metrics) = spawn_ready(&nats, &etcd, mode, "nats-closed");
    // A paused etcd holds the exit open at its lease revoke (bounded, about
    // 3 s here), long enough to read `/readyz` on the way out.
    etcd.pause();
    worker.signal("USR1");
    let injected = Instant::now();
    let mut answers = Vec::new();
    poll_until_blocking(EXIT, || {
        if !worker.is_running() {
            return true;
        }
        if let Ok(reply) = http_send(&metrics, b"GET /readyz HTTP/1.1\r\n\r\n") {
            answers.push((reply.status, reply.body));
        }
        false
    });
    let code = worker.wait_exit(EXIT);
    etcd.resume();
    let log = worker.log();
    println!(
        "{mode}: exited {code:?} {:?} after the fault; /readyz answers: {:?}",
        injected.elapsed(),
        answers.iter().map(|(s, _)| s).collect::<Vec<_>>()
    );
    assert!(
        log.contains("injecting"),
        "the fault was not injected:\n{log}"
    );
    assert_eq!(code, Some(1), "exit code:\n{log}");
    // The drain itself takes a moment; once /readyz is not 200, it stays 503.
    let first_down = answers
        .iter()
        .position(|(status, _)| *status != 200)
        .unwrap_or_else(|| panic!("/readyz never went down before the exit: {answers:?}"));
    for (status, body) in &answers[first_down..] {
        assert_eq!(*status, 503, "{answers:?}");
        assert!(body.contains("nats_connected"), "{body}");
    }
    // Core mode may see its subscription end first (the drain closes it
    // before the connection task ends): either reason is an error exit.
    assert!(
        log.contains("exiting with an error so that the service manager restarts the worker"),
        "{log}"
    );
}

#[test]
fn core_nats_connection_ended_for_good_makes_the_worker_unready_and_exit_non_zero() {
    connection_end_makes_the_worker_unready_and_exit_non_zero("core");
}

#[test]
fn jetstream_nats_connection_ended_for_good_makes_the_worker_unready_and_exit_non_zero() {
    connection_end_makes_the_worker_unready_and_exit_non_zero("jetstream");
}

#[test]
fn a_panic_in_any_task_exits_the_process_non_zero() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let (mut worker, _) = spawn_ready(&nats, &etcd, "core", "task-panic");
    worker.signal("USR1");
    let code = worker.wait_exit(EXIT);
    let log = worker.log();
    assert_eq!(code, Some(1), "exit code:\n{log}");
    assert!(
        log.contains("PREFILL_HANDOFF_DEBUG_FAULT=task-panic"),
        "{log}"
    );
    assert!(log.contains("a panic; exiting with code 1"), "{log}");
}
