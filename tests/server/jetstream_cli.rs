//! `prefill-handoff setup` as a process: idempotent, clear about what it did,
//! exit 2 for configuration errors and 1 when NATS cannot be reached.

use crate::common;

use common::Nats;
use std::process::{Command, Output};

fn setup(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
        .arg("setup")
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run prefill-handoff setup")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lines naming objects, and the notes after them.
fn objects_and_notes(out: &str) -> (String, Vec<&str>) {
    let (notes, objects): (Vec<&str>, Vec<&str>) =
        out.lines().partition(|line| line.starts_with("note: "));
    let objects = objects.iter().map(|line| format!("{line}\n")).collect();
    (objects, notes)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn jetstream_setup_command_creates_then_changes_nothing() {
    let nats = Nats::start();
    let url = nats.url();
    let first = setup(&["--nats-url", &url]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let printed = stdout(&first);
    let (objects, notes) = objects_and_notes(&printed);
    assert_eq!(
        objects,
        "stream LLM_PREFILL: created\nstream LLM_GEN: created\nstream LLM_CANCEL: created\nconsumer LLM_PREFILL/handoff: created\n"
    );
    // Before nats-server 2.11 setup says once that GEN cannot expire jobs.
    let old_server = !prefill_handoff::setup::supports_msg_ttl(&nats.version());
    assert_eq!(notes.len(), usize::from(old_server), "{notes:?}");
    let second = setup(&["--nats-url", &url]);
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert_eq!(
        objects_and_notes(&stdout(&second)).0,
        "stream LLM_PREFILL: unchanged\nstream LLM_GEN: unchanged\nstream LLM_CANCEL: unchanged\nconsumer LLM_PREFILL/handoff: unchanged\n"
    );
    let changed = setup(&["--nats-url", &url, "--set", "jetstream.ack_wait_secs=45"]);
    assert_eq!(changed.status.code(), Some(0), "{}", stderr(&changed));
    assert!(
        stdout(&changed).contains("consumer LLM_PREFILL/handoff: updated (ack_wait 30s → 45s)"),
        "{}",
        stdout(&changed)
    );
}

#[test]
fn jetstream_setup_command_refuses_what_the_server_cannot_change() {
    let nats = Nats::start();
    let url = nats.url();
    assert_eq!(setup(&["--nats-url", &url]).status.code(), Some(0));
    let out = setup(&["--nats-url", &url, "--set", "jetstream.storage=memory"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("stream LLM_PREFILL")
            && err.contains("storage")
            && err.contains("delete the stream"),
        "{err}"
    );
}

#[test]
fn jetstream_setup_command_exit_codes() {
    let out = setup(&["--set", "jetstream.storage=disk"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("jetstream.storage"),
        "{}",
        stderr(&out)
    );

    let out = setup(&["--nats-url", "nats://127.0.0.1:notaport"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("nats.url"), "{}", stderr(&out));

    let port = common::free_port();
    let out = setup(&["--nats-url", &format!("nats://127.0.0.1:{port}")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot connect to NATS"),
        "{}",
        stderr(&out)
    );
}
