//! The commands that need no network (contract 8): `explain`, `mint-id` and
//! `decode-id`, run as the real binary. Exit codes: 0 success, 2 usage, 1
//! anything else.

use prefill_handoff::ids::IdLayout;
use serde_json::{Value as Json, json};
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
}

/// Runs the binary with `args`, feeding `stdin`.
fn run(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut input = child.stdin.take().expect("stdin");
    // The command may exit before reading everything (usage errors).
    let _ = input.write_all(stdin);
    drop(input);
    child.wait_with_output().expect("the binary finishes")
}

/// `explain` with `HANDOFF_*` variables set (and none inherited).
fn explain_with_env(args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Json {
    let mut cmd = bin();
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("HANDOFF_") {
            cmd.env_remove(name);
        }
    }
    let mut child = cmd
        .arg("explain")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut input = child.stdin.take().expect("stdin");
    let _ = input.write_all(stdin);
    drop(input);
    let out = child.wait_with_output().expect("the binary finishes");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("explain prints JSON")
}

fn explain(args: &[&str], stdin: &[u8]) -> Json {
    let out = run(&[&["explain"], args].concat(), stdin);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("explain prints JSON")
}

/// A TensorRT-LLM result without `disagg_request_id`: the worker refuses
/// it by default ([`MINT`] makes it mint one).
fn trt_result(finish_reason: Json) -> Json {
    json!({
        "request_id": "req-1",
        "reply_to": "_INBOX.client.1",
        "frames": [{
            "token_ids": [42],
            "finish_reason": finish_reason,
            "disaggregated_params": {"ctx_request_id": 7, "request_type": "context_only", "opaque_state": "AAEC"}
        }],
        "request": {"model": "m"}
    })
}

/// The policy under which the worker mints a missing `disagg_request_id`.
const MINT: [&str; 2] = ["--set", "trtllm.missing_disagg_request_id=mint"];

#[test]
fn explain_prints_each_outcome() {
    let decode = explain(
        &[&MINT[..], &["--machine-id", "1020"]].concat(),
        trt_result(json!("length")).to_string().as_bytes(),
    );
    assert_eq!(decode["outcome"], "decode");
    assert_eq!(decode["subject"], "llm.gen.jobs");
    assert_eq!(decode["headers"]["Nats-Msg-Id"], "handoff-req-1");
    let job = &decode["message"];
    assert_eq!(job["backend"], "trtllm");
    assert_eq!(job["handoff"]["request_type"], "generation_only");
    assert_eq!(job["handoff"]["opaque_state"], "AAEC");
    assert_eq!(job["request"], json!({"model": "m"}));
    assert_eq!(job["worker"]["machine_id"], 1020);
    let id = job["disagg_request_id"].as_u64().expect("a minted ID");
    assert_eq!(job["handoff"]["disagg_request_id"], id);
    assert_eq!(IdLayout::Rc22.decode(id).map(|d| d.machine_id), Ok(1020));

    let terminal = explain(&[], trt_result(json!("eos")).to_string().as_bytes());
    assert_eq!(terminal["outcome"], "terminal");
    assert_eq!(terminal["subject"], "_INBOX.client.1");
    assert_eq!(terminal["message"]["kind"], "terminal");
    assert_eq!(
        terminal["message"]["output"].get("disaggregated_params"),
        None
    );

    let mut bad = trt_result(json!("length"));
    bad["frames"][0]["disaggregated_params"]["ctx_request_id"] = Json::Null;
    let error = explain(&[], bad.to_string().as_bytes());
    assert_eq!(error["outcome"], "error");
    assert_eq!(error["subject"], "_INBOX.client.1");
    assert_eq!(error["message"]["error"]["code"], "missing_ctx_request_id");
    assert_eq!(error["code"], "missing_ctx_request_id");
    assert_eq!(error.get("release"), None, "params that failed validation");

    // By default the ID belongs to the context phase: a result without it
    // is refused, and its KV released.
    let refused = explain(&[], trt_result(json!("length")).to_string().as_bytes());
    assert_eq!(refused["code"], "missing_disagg_request_id");
    assert_eq!(refused["release"]["subject"], "llm.kv.release");
    assert_eq!(
        refused["release"]["message"]["reason"],
        "missing_disagg_request_id"
    );
    let mut kept = trt_result(json!("length"));
    kept["frames"][0]["disaggregated_params"]["disagg_request_id"] = json!(1_099_511_627_777u64);
    let kept = explain(&[], kept.to_string().as_bytes());
    assert_eq!(kept["outcome"], "decode");
    assert_eq!(kept["message"]["disagg_request_id"], 1_099_511_627_777u64);
}

#[test]
fn explain_reads_a_file_and_messagepack() {
    let dir = tempfile::tempdir().expect("tempdir");
    let value = rmpv::ext::to_value(trt_result(json!("stop"))).expect("to msgpack");
    let bytes = prefill_handoff::wire::encode(&value, prefill_handoff::wire::Encoding::MsgPack);
    let path = dir.path().join("result.msgpack");
    std::fs::write(&path, &bytes).expect("write");
    let out = explain(&["--msgpack", path.to_str().expect("utf-8 path")], b"");
    assert_eq!(out["outcome"], "terminal");
    assert_eq!(out["message"]["output"]["finish_reason"], "stop");
    assert_eq!(
        out["headers"],
        json!({}),
        "MessagePack outputs carry no Content-Type"
    );
    // The same file read as JSON is malformed.
    let out = explain(&[path.to_str().expect("utf-8 path")], b"");
    assert_eq!(out["outcome"], "dead_letter");
}

#[test]
fn explain_turns_malformed_input_into_a_dead_letter_never_a_panic() {
    let cases: [(&[&str], &[u8], &str, Json); 7] = [
        (&[], b"not json", "malformed", json!("not json")),
        (&[], b"", "malformed", json!("")),
        (&[], b"[1, 2]", "malformed", json!([1, 2])),
        (
            &[],
            br#"{"request_id": "r", "frames": []}"#,
            "missing_reply_to",
            json!({"request_id": "r", "frames": []}),
        ),
        (
            &[],
            br#"{"request_id": "r", "reply_to": "$JS.API.STREAM.DELETE.X", "frames": []}"#,
            "reply_to_not_allowed",
            json!({"request_id": "r", "reply_to": "$JS.API.STREAM.DELETE.X", "frames": []}),
        ),
        (&["--msgpack"], &[0xc1], "malformed", json!("\u{fffd}")),
        (
            &["--msgpack"],
            &[0x93, 0x01],
            "malformed",
            json!("\u{fffd}\u{1}"),
        ),
    ];
    for (args, input, code, message) in cases {
        let out = explain(args, input);
        assert_eq!(out["outcome"], "dead_letter", "{input:?}");
        assert_eq!(out["subject"], "llm.handoff.dead");
        assert_eq!(out["code"], code);
        assert_eq!(out["headers"]["Handoff-Error-Code"], code);
        assert_eq!(
            out["headers"]["Handoff-Source-Subject"],
            "llm.prefill.results"
        );
        assert_eq!(out["message"], message, "{input:?}");
    }
}

#[test]
fn explain_options_change_the_rules() {
    let no_reply_to = br#"{"request_id": "r", "frames": [{"finish_reason": "eos"}]}"#;
    let out = explain(&["--nats-reply", "_INBOX.n.1"], no_reply_to);
    assert_eq!(out["outcome"], "terminal");
    assert_eq!(out["subject"], "_INBOX.n.1");
    let out = explain(
        &["--nats-reply", "_INBOX.n.1", "--mode", "jetstream"],
        no_reply_to,
    );
    assert_eq!(out["code"], "missing_reply_to");

    let out = explain(
        &[&MINT[..], &["--namespace", "prod"]].concat(),
        trt_result(json!("length")).to_string().as_bytes(),
    );
    assert_eq!(out["subject"], "prod.gen.jobs");
    let with_ns_reply = json!({"request_id": "r", "reply_to": "prod.replies.x", "frames": [{"finish_reason": "eos"}]});
    assert_eq!(
        explain(
            &["--namespace", "prod"],
            with_ns_reply.to_string().as_bytes()
        )["subject"],
        "prod.replies.x"
    );
    assert_eq!(
        explain(&[], with_ns_reply.to_string().as_bytes())["outcome"],
        "dead_letter"
    );

    let out = explain(
        &[&MINT[..], &["--id-layout", "rc21", "--machine-id", "5"]].concat(),
        trt_result(json!(null)).to_string().as_bytes(),
    );
    let id = out["message"]["disagg_request_id"]
        .as_u64()
        .expect("minted");
    assert_eq!(IdLayout::Rc21.decode(id).map(|d| d.machine_id), Ok(5));
}

/// `explain` reads the configuration as `run` does: file, environment,
/// flags.
#[test]
fn explain_applies_the_configuration_of_run() {
    let custom = json!({"request_id": "r", "reply_to": "custom.reply.x", "frames": [{"finish_reason": "eos"}]});
    let custom = custom.to_string();
    let refused = explain_with_env(&[], &[], custom.as_bytes());
    assert_eq!(refused["code"], "reply_to_not_allowed");

    let env = [("HANDOFF_ALLOWED_REPLY_SUBJECTS", "custom.reply.>")];
    let allowed = explain_with_env(&[], &env, custom.as_bytes());
    assert_eq!(allowed["outcome"], "terminal");
    assert_eq!(allowed["subject"], "custom.reply.x");

    let mut file = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("temp file");
    file.write_all(b"allowed_reply_subjects = [\"custom.reply.>\", \"_INBOX.>\"]\n[subjects]\ngen = \"custom.gen\"\n")
        .expect("write");
    let path = file.path().to_str().expect("utf-8 path");
    let allowed = explain_with_env(&["--config", path], &[], custom.as_bytes());
    assert_eq!(allowed["subject"], "custom.reply.x");
    let job = explain_with_env(
        &[&["--config", path], &MINT[..]].concat(),
        &[],
        trt_result(json!("length")).to_string().as_bytes(),
    );
    assert_eq!(job["subject"], "custom.gen");
    // A flag beats the file, as for `run`.
    let job = explain_with_env(
        &[
            &["--config", path, "--set", "subjects.gen=flag.gen"],
            &MINT[..],
        ]
        .concat(),
        &[],
        trt_result(json!("length")).to_string().as_bytes(),
    );
    assert_eq!(job["subject"], "flag.gen");
    // The worker's files are not read: explain runs where they are not.
    let elsewhere = explain_with_env(
        &["--set", "nats.tls.ca_file=/nonexistent/ca.pem"],
        &[("HANDOFF_NATS__CREDENTIALS_FILE", "/nonexistent/nats.creds")],
        custom.as_bytes(),
    );
    assert_eq!(elsewhere["code"], "reply_to_not_allowed");
}

#[test]
fn mint_id_prints_increasing_ids_of_the_slot() {
    for layout in ["rc21", "rc22"] {
        let out = run(
            &[
                "mint-id",
                "--machine-id",
                "1020",
                "--layout",
                layout,
                "--count",
                "5000",
            ],
            b"",
        );
        assert_eq!(out.status.code(), Some(0));
        let ids: Vec<u64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.parse().expect("one integer per line"))
            .collect();
        assert_eq!(ids.len(), 5000);
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "{layout}: strictly increasing"
        );
        let layout: IdLayout = layout.parse().expect("layout");
        assert!(
            ids.iter()
                .all(|id| layout.decode(*id).map(|d| d.machine_id) == Ok(1020))
        );
    }
    let out = run(&["mint-id", "--machine-id", "0"], b"");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}

#[test]
fn decode_id_reverses_the_layout() {
    let id = IdLayout::Rc22.encode(
        123_456,
        prefill_handoff::ids::MachineId::new(1020).expect("slot"),
        9,
    );
    let out = run(&["decode-id", &id.to_string()], b"");
    assert_eq!(out.status.code(), Some(0));
    let fields: Json = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        fields,
        json!({"timestamp_ms": 123_456, "machine_id": 1020, "node_id": 15, "process_id": 60, "counter": 9, "layout": "rc22"})
    );
    let id = IdLayout::Rc21.encode(
        77,
        prefill_handoff::ids::MachineId::new(1020).expect("slot"),
        4095,
    );
    let out = run(&["decode-id", &id.to_string(), "--layout", "rc21"], b"");
    let fields: Json = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        fields,
        json!({"timestamp_ms": 77, "machine_id": 1020, "counter": 4095, "layout": "rc21"})
    );
}

#[test]
fn usage_errors_exit_2_and_say_what_was_expected() {
    let cases: [&[&str]; 11] = [
        &["mint-id", "--machine-id", "1021"],
        &["mint-id", "--machine-id", "-1"],
        &["mint-id", "--machine-id", "5", "--layout", "rc23"],
        &["mint-id", "--machine-id", "5", "--count", "0"],
        &["mint-id"],
        &["decode-id", "12"],
        &["decode-id", "not-a-number"],
        &["decode-id", "1099511627776", "--layout", "rc3"],
        &["explain", "--machine-id", "1021"],
        &["explain", "--id-layout", "v1"],
        &["explain", "--mode", "fast"],
    ];
    for args in cases {
        let out = run(args, b"{}");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stderr.is_empty(), "{args:?} explains itself");
        assert!(out.stdout.is_empty(), "{args:?} prints no result");
    }
    let out = run(&["mint-id", "--machine-id", "1021"], b"");
    assert!(String::from_utf8_lossy(&out.stderr).contains("[0, 1021)"));
}

#[test]
fn other_failures_exit_1() {
    let out = run(&["explain", "/nonexistent/prefill-result.json"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/prefill-result.json"));
}
