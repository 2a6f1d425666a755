//! Supervision: a worker that can no longer work exits non-zero, so systemd
//! (`Restart=always`) or Kubernetes starts a fresh one, instead of staying up
//! and doing nothing.
//!
//! - A panic anywhere (any thread, any task) exits the process with
//!   [`PANIC_EXIT_CODE`]. Tokio catches a panicking task's unwind and only
//!   reports it to whoever awaits its handle; a panic in a task nobody awaits
//!   (async-nats' connection task, a spawned handler) would otherwise leave a
//!   process that looks alive.
//! - The NATS client's connection task ending for good, other than by our own
//!   shutdown, ends `run` with an error (see `run::serve`): `/readyz` turns
//!   503 at once, the lease is revoked, the exit code is 1.
//! - Debug builds only: `PREFILL_HANDOFF_DEBUG_FAULT` makes the process inject one of
//!   those failures on SIGUSR1, for the process tests (tests/server/supervision.rs).

use async_nats::Client;

/// The exit code after a panic: the contract's 1 for "anything else" (Rust's
/// own 101 for a panicking main thread is not one of the contract's codes).
pub const PANIC_EXIT_CODE: i32 = 1;

/// Makes every panic exit the process with [`PANIC_EXIT_CODE`], after the
/// default hook has printed it (message, location, backtrace if asked for).
/// Nothing else is done in the hook: the panicking thread may hold any lock,
/// the logger's included.
pub fn exit_on_panic() {
    let print = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        print(info);
        eprintln!(
            "prefill-handoff: a panic; exiting with code {PANIC_EXIT_CODE} so that the service manager restarts the worker"
        );
        std::process::exit(PANIC_EXIT_CODE);
    }));
}

/// Why the worker stopped working before any shutdown was asked for.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    #[error(
        "the NATS client's connection ended for good (its task ended or the client closed); it cannot reconnect"
    )]
    ConnectionEnded,
    #[error("the worker stopped taking input without a shutdown request (its subscription ended)")]
    InputEnded,
}

/// The failure the process injects on SIGUSR1, from `PREFILL_HANDOFF_DEBUG_FAULT`.
/// Compiled into debug builds only: the tests run the debug binary, and a
/// release build has no way to be told to break itself.
#[cfg(debug_assertions)]
pub fn debug_fault(client: &Client) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(fault) = std::env::var("PREFILL_HANDOFF_DEBUG_FAULT") else {
        return;
    };
    let Ok(mut usr1) = signal(SignalKind::user_defined1()) else {
        return;
    };
    let client = client.clone();
    tokio::spawn(async move {
        usr1.recv().await;
        tracing::warn!(fault, "PREFILL_HANDOFF_DEBUG_FAULT: injecting");
        match fault.as_str() {
            // Drains and closes the client: its connection task ends for good,
            // as after a panic in it or a client that gave up reconnecting.
            "nats-closed" => {
                let _ = client.drain().await;
            }
            // A panic in a spawned task whose handle nobody awaits.
            "task-panic" => {
                tokio::spawn(async { panic!("PREFILL_HANDOFF_DEBUG_FAULT=task-panic") });
            }
            other => tracing::error!(fault = other, "unknown PREFILL_HANDOFF_DEBUG_FAULT"),
        }
    });
}

#[cfg(not(debug_assertions))]
pub fn debug_fault(_client: &Client) {}
