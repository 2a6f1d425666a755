//! Secure transport against real servers, with certificates made at test
//! time (`common::tls`): mutual TLS to nats-server (`tls { verify: true }`)
//! and to etcd (`--client-cert-auth` over `https://`) in core and JetStream
//! mode; handshakes refused at start (exit 1, one line, nothing published);
//! NKey-seed auth; the least-privilege worker user of
//! `config/nats/handoff-permissions.conf`.

use crate::common;

use async_nats::{Client, ConnectOptions, HeaderMap};
use common::tls::{Pki, nats_server_version};
use common::{Etcd, Nats, Worker, free_port, http_send};
use futures::StreamExt;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use tokio::task::block_in_place;

const START: Duration = Duration::from_secs(45);

/// Environment variables for the worker.
type Env = Vec<(String, String)>;

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Mode {
    Core,
    Jetstream,
}

/// Starts `run` with `env` and waits until it consumes.
pub(crate) fn spawn_worker(
    nats: &Nats,
    etcd: &Etcd,
    mode: Mode,
    env: &[(String, String)],
) -> Worker {
    let worker = spawn(nats, etcd, mode, env);
    let ready = match mode {
        Mode::Core => "consuming prefill results",
        Mode::Jetstream => "consuming from JetStream",
    };
    let up = block_in_place(|| worker.wait_for_log(ready, START));
    assert!(up, "the worker did not start:\n{}", worker.log());
    worker
}

fn spawn(nats: &Nats, etcd: &Etcd, mode: Mode, env: &[(String, String)]) -> Worker {
    let mut all: Vec<(String, String)> = vec![
        ("HANDOFF_NATS__URL".into(), nats.url()),
        ("HANDOFF_ETCD__ENDPOINTS".into(), etcd.endpoint()),
        (
            "HANDOFF_METRICS_ADDR".into(),
            format!("127.0.0.1:{}", free_port()),
        ),
        (
            "HANDOFF_MODE".into(),
            match mode {
                Mode::Core => "core".into(),
                Mode::Jetstream => "jetstream".into(),
            },
        ),
        ("HANDOFF_SHUTDOWN_TIMEOUT_SECS".into(), "3".into()),
        ("NO_COLOR".into(), "1".into()),
    ];
    all.extend(env.iter().cloned());
    let env: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Worker::spawn(&["run"], &env)
}

/// A test client that connects with the PKI's CA and client certificate.
async fn tls_client(nats: &Nats, pki: &Pki, extra: ConnectOptions) -> Client {
    extra
        .add_root_certificates(pki.file("ca.pem"))
        .add_client_certificate(pki.file("client.pem"), pki.file("client-key.pem"))
        .require_tls(true)
        .connect(nats.url())
        .await
        .expect("the test client connects over mutual TLS")
}

/// One result that needs a minted ID (decode job) and one that is finished
/// (terminal response): both outputs arrive, and the decode job carries the
/// machine ID of the slot the worker holds in etcd.
async fn hands_off(client: &Client, etcd: &Etcd, tag: &str) {
    let mut gen_jobs = client.subscribe("llm.gen.jobs").await.expect("subscribe");
    let mut replies = client
        .subscribe(format!("llm.replies.{tag}.>"))
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    let mut headers = HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    let decode = json!({"request_id": format!("{tag}-d"), "reply_to": format!("llm.replies.{tag}.d"),
        "frames": [{"disaggregated_params": {"ctx_request_id": 7, "request_type": "context_only"}}]});
    let terminal = json!({"request_id": format!("{tag}-t"), "reply_to": format!("llm.replies.{tag}.t"),
        "frames": [{"finish_reason": "eos", "text": "done"}]});
    for body in [decode, terminal] {
        client
            .publish_with_headers(
                "llm.prefill.results",
                headers.clone(),
                serde_json::to_vec(&body).unwrap().into(),
            )
            .await
            .expect("publish");
    }
    client.flush().await.expect("flush");
    let wait = Duration::from_secs(30);
    let job = tokio::time::timeout(wait, gen_jobs.next())
        .await
        .expect("a decode job within 30 s")
        .expect("open subscription");
    let job: Value = serde_json::from_slice(&job.payload).expect("a JSON decode job");
    assert_eq!(job["request_id"], format!("{tag}-d"));
    let reply = tokio::time::timeout(wait, replies.next())
        .await
        .expect("a terminal response within 30 s")
        .expect("open subscription");
    let reply: Value = serde_json::from_slice(&reply.payload).expect("a JSON response");
    assert_eq!(reply["kind"], "terminal", "{reply}");
    let machine_id = job["worker"]["machine_id"].as_u64().expect("a machine ID");
    let slot = format!("/llm/handoff/machine-ids/{machine_id}");
    assert!(
        etcd.get_prefix(&slot).iter().any(|(key, _)| *key == slot),
        "the decode job's machine ID {machine_id} is the slot the worker holds in etcd"
    );
}

async fn mutual_tls_hands_off(mode: Mode) {
    let pki = Pki::new();
    let nats = Nats::start_with_config(&pki.nats_tls_block("server", true, false));
    let etcd = Etcd::start_tls(&pki);
    let mut env = pki.nats_env("client");
    env.extend(pki.etcd_env());
    let mut worker = spawn_worker(&nats, &etcd, mode, &env);
    let client = tls_client(&nats, &pki, ConnectOptions::new()).await;
    hands_off(&client, &etcd, "mtls").await;
    worker.sigterm();
    let code = block_in_place(|| worker.wait_exit(Duration::from_secs(30)));
    assert_eq!(code, Some(0), "{}", worker.log());
    let log = worker.log();
    for secret in ["BEGIN PRIVATE KEY", "BEGIN CERTIFICATE"] {
        assert!(!log.contains(secret), "the log shows a PEM block");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_to_nats_and_etcd_hands_off_in_core_mode() {
    mutual_tls_hands_off(Mode::Core).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_to_nats_and_etcd_hands_off_in_jetstream_mode() {
    mutual_tls_hands_off(Mode::Jetstream).await;
}

/// `in_msgs` of the server's /varz: every message any client published.
fn published(monitor: u16) -> u64 {
    // nats-server keeps HTTP/1.1 connections open unless asked not to.
    let request = b"GET /varz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n";
    let reply = http_send(("127.0.0.1", monitor), request).expect("GET /varz");
    // Read the field from the text: newer servers answer in chunks.
    let at = reply.body.find("\"in_msgs\":").expect("varz has in_msgs") + 10;
    let digits: String = reply.body[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("in_msgs is a number")
}

/// Waits for the worker to exit; its code and its last log line.
fn exit_line(worker: &mut Worker) -> (Option<i32>, String) {
    let code = block_in_place(|| worker.wait_exit(Duration::from_secs(60)));
    let log = worker.log();
    let last = log.lines().last().unwrap_or_default().to_string();
    (code, last)
}

/// Each row: the server's TLS (`None`: plaintext), the worker's TLS
/// settings, what the one line must say. The worker exits 1 and the server
/// counts no published message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_nats_handshake_stops_the_start_with_one_line_and_publishes_nothing() {
    let pki = Pki::new();
    let etcd = Etcd::start();
    let ca = ("HANDOFF_NATS__TLS__CA_FILE".to_string(), pki.path("ca.pem"));
    let rows: Vec<(Option<&str>, Env, &str)> = vec![
        (
            Some("server"),
            vec![ca.clone()],
            "requires a client certificate",
        ),
        (
            Some("server"),
            pki.nats_env("other-client"),
            "refused the client certificate",
        ),
        (
            Some("server"),
            {
                let mut env = pki.nats_env("client");
                env[0].1 = pki.path("other-ca.pem");
                env
            },
            "signed by an unknown CA",
        ),
        (
            Some("expired-server"),
            pki.nats_env("client"),
            "has expired",
        ),
        (
            Some("elsewhere-server"),
            pki.nats_env("client"),
            "name mismatch",
        ),
        (
            None,
            vec![("HANDOFF_NATS__TLS__REQUIRED".into(), "true".into())],
            "does not seem to offer TLS",
        ),
    ];
    for (server, env, reason) in rows {
        let monitor = free_port();
        let mut config = format!("http: \"127.0.0.1:{monitor}\"\n");
        if let Some(server) = server {
            config.push_str(&pki.nats_tls_block(server, true, false));
        }
        let nats = Nats::start_with_config(&config);
        let mut worker = spawn(&nats, &etcd, Mode::Core, &env);
        let (code, last) = exit_line(&mut worker);
        let case = format!("{server:?} / {reason}");
        assert_eq!(code, Some(1), "{case}:\n{}", worker.log());
        assert!(last.contains(reason), "{case}: {last:?}");
        assert!(
            last.contains("TLS to NATS at nats://127.0.0.1:"),
            "{case}: {last:?}"
        );
        assert_eq!(published(monitor), 0, "{case}: the worker published");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_refusing_the_client_stops_the_start_with_one_line() {
    let pki = Pki::new();
    let etcd = Etcd::start_tls(&pki);
    let nats = Nats::start();
    let ca = ("HANDOFF_ETCD__TLS__CA_FILE".to_string(), pki.path("ca.pem"));
    let rows: Vec<(Env, &[&str])> = vec![
        (vec![ca.clone()], &["etcd", "client certificate"]),
        (
            vec![(
                "HANDOFF_ETCD__TLS__CA_FILE".into(),
                pki.path("other-ca.pem"),
            )],
            &["etcd server's certificate is signed by an unknown CA"],
        ),
    ];
    for (env, reasons) in rows {
        let mut worker = spawn(&nats, &etcd, Mode::Core, &env);
        let (code, last) = exit_line(&mut worker);
        assert_eq!(code, Some(1), "{reasons:?}:\n{}", worker.log());
        for reason in reasons {
            assert!(last.contains(reason), "{reasons:?}: {last:?}");
        }
    }
}

/// An NKey user for the worker and a password user for the test's side.
async fn nkey_hands_off(mode: Mode) {
    let pair = nkeys::KeyPair::new_user();
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("worker.nk");
    std::fs::write(&seed, pair.seed().unwrap()).unwrap();
    let nats = Nats::start_with_config(&format!(
        "authorization {{ users = [ {{ nkey: {:?} }}, {{ user: test, password: test }} ] }}\n",
        pair.public_key()
    ));
    let etcd = Etcd::start();
    let env = vec![(
        "HANDOFF_NATS__NKEY_SEED_FILE".to_string(),
        seed.display().to_string(),
    )];
    let worker = spawn_worker(&nats, &etcd, mode, &env);
    let client = ConnectOptions::with_user_and_password("test".into(), "test".into())
        .connect(nats.url())
        .await
        .expect("test client");
    hands_off(&client, &etcd, "nkey").await;
    assert!(
        !worker.log().contains(pair.seed().unwrap().as_str()),
        "the log shows the seed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nkey_seed_auth_hands_off_in_core_mode() {
    nkey_hands_off(Mode::Core).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nkey_seed_auth_hands_off_in_jetstream_mode() {
    nkey_hands_off(Mode::Jetstream).await;
}

fn permissions_file() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/nats/handoff-permissions.conf"
    ))
}

/// nats-server with the shipped permissions, inlined (nats-server resolves
/// `include` relative to its own file only): user `core` and user
/// `jetstream` get the mode's set, user `test` everything. (nats-server
/// refuses a defined variable that no user references.)
pub(crate) fn least_privilege_server(monitor: u16) -> Nats {
    let permissions = std::fs::read_to_string(permissions_file()).expect("the shipped file");
    Nats::start_with_config(&format!(
        "http: \"127.0.0.1:{monitor}\"\n{permissions}\nauthorization {{ users = [ \
         {{ user: core, password: pw, permissions: $HANDOFF_WORKER_CORE }}, \
         {{ user: jetstream, password: pw, permissions: $HANDOFF_WORKER_JETSTREAM }}, \
         {{ user: test, password: test }} ] }}\n"
    ))
}

fn worker_user(mode: Mode) -> &'static str {
    match mode {
        Mode::Core => "core",
        Mode::Jetstream => "jetstream",
    }
}

async fn least_privilege_hands_off(mode: Mode) {
    let nats = least_privilege_server(free_port());
    let etcd = Etcd::start();
    let env = vec![
        (
            "HANDOFF_NATS__USER".to_string(),
            worker_user(mode).to_string(),
        ),
        ("HANDOFF_NATS__PASSWORD".to_string(), "pw".to_string()),
    ];
    let client = ConnectOptions::with_user_and_password("test".into(), "test".into())
        .connect(nats.url())
        .await
        .expect("test client");
    if mode == Mode::Jetstream {
        // A cancel kept by the server, which the worker loads at start.
        let mut config = prefill_handoff::config::Config::default();
        config.mode = prefill_handoff::config::Mode::Jetstream;
        let config = config.resolve().expect("config");
        let js = async_nats::jetstream::new(client.clone());
        prefill_handoff::setup::ensure(&js, &config)
            .await
            .expect("setup");
        let cancel = b"\x81\xaarequest_id\xa1x".to_vec();
        js.publish("llm.handoff.cancel", cancel.into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    let mut worker = spawn_worker(&nats, &etcd, mode, &env);
    if mode == Mode::Jetstream {
        assert!(worker.log().contains("loaded=1"), "{}", worker.log());
    }
    hands_off(&client, &etcd, "least").await;
    worker.sigterm();
    let code = block_in_place(|| worker.wait_exit(Duration::from_secs(30)));
    assert_eq!(code, Some(0), "{}", worker.log());
    // Anything the worker tried beyond its permissions shows in the log.
    let server_log = nats.log();
    assert!(
        !server_log.contains("Violation"),
        "the worker needed more than the shipped permissions:\n{server_log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_user_hands_off_in_core_mode() {
    least_privilege_hands_off(Mode::Core).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_user_hands_off_in_jetstream_mode() {
    least_privilege_hands_off(Mode::Jetstream).await;
}

/// A JetStream-mode worker whose user lacks the JetStream API permissions
/// (the core set): the server drops its API requests with a permissions
/// violation, and the worker exits 1 at start with the server's words,
/// instead of waiting for JetStream forever as for a server not ready yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_jetstream_permissions_stops_the_start_with_the_servers_words() {
    let nats = least_privilege_server(free_port());
    let etcd = Etcd::start();
    let env = vec![
        (
            "HANDOFF_NATS__USER".to_string(),
            worker_user(Mode::Core).to_string(),
        ),
        ("HANDOFF_NATS__PASSWORD".to_string(), "pw".to_string()),
    ];
    let mut worker = spawn(&nats, &etcd, Mode::Jetstream, &env);
    let (code, last) = exit_line(&mut worker);
    assert_eq!(code, Some(1), "{}", worker.log());
    assert!(
        last.contains("Permissions Violation for Publish to \"$JS.API."),
        "{last:?}"
    );
    assert!(last.contains("handoff-permissions.conf"), "{last:?}");
}

/// Defence in depth behind the reply allowlist: the worker's user cannot
/// publish to a subject outside its list, nor to the JetStream API beyond
/// its own stream and consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_user_is_refused_publishing_outside_its_permissions() {
    for mode in [Mode::Core, Mode::Jetstream] {
        let nats = least_privilege_server(free_port());
        let admin = ConnectOptions::with_user_and_password("test".into(), "test".into())
            .connect(nats.url())
            .await
            .expect("test client");
        let mut seen = admin.subscribe(">").await.expect("subscribe");
        // The server has the subscription before the worker's connection
        // publishes; the round trip's own message is the first one seen.
        common::worker_support::round_trip(&admin).await;
        let echo = tokio::time::timeout(Duration::from_secs(10), seen.next())
            .await
            .expect("the round trip's message")
            .expect("open subscription");
        assert!(echo.subject.starts_with("test.harness."), "{echo:?}");
        let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
        let worker = ConnectOptions::with_user_and_password(worker_user(mode).into(), "pw".into())
            .event_callback(move |event| {
                let errors_tx = errors_tx.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        let _ = errors_tx.send(e.to_string());
                    }
                }
            })
            .connect(nats.url())
            .await
            .expect("the worker user connects");
        for subject in [
            "llm.prefill.results",
            "llm.other",
            "$JS.API.STREAM.DELETE.LLM_GEN",
        ] {
            worker
                .publish(subject, "x".into())
                .await
                .expect("publish is queued");
            worker.flush().await.expect("flush");
            let error = tokio::time::timeout(Duration::from_secs(10), errors.recv())
                .await
                .expect("the server answers with an error within 10 s")
                .unwrap_or_default();
            assert!(
                error.contains("Permissions Violation") && error.contains(subject),
                "{subject}: {error}"
            );
        }
        // Allowed subjects still go through, and nothing refused arrived.
        worker
            .publish("llm.replies.ok", "y".into())
            .await
            .expect("publish");
        worker.flush().await.expect("flush");
        let arrived = tokio::time::timeout(Duration::from_secs(10), seen.next())
            .await
            .expect("a message within 10 s")
            .expect("open subscription");
        assert_eq!(arrived.subject.as_str(), "llm.replies.ok");
    }
}

/// `nats.tls.first` against a server with `handshake_first` (nats-server
/// 2.10 and later; skipped on older builds, where the option does not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_first_hands_off_in_jetstream_mode_on_servers_from_2_10() {
    let Some(version) = nats_server_version(&common::nats_server_binary()) else {
        panic!("cannot read the nats-server version");
    };
    if version < (2, 10, 0) {
        eprintln!("nats-server {version:?} has no handshake_first; skipped");
        return;
    }
    let pki = Pki::new();
    let nats = Nats::start_with_config(&pki.nats_tls_block("server", true, true));
    let etcd = Etcd::start();
    let mut env = pki.nats_env("client");
    env.push(("HANDOFF_NATS__TLS__FIRST".into(), "true".into()));
    let _worker = spawn_worker(&nats, &etcd, Mode::Jetstream, &env);
    let client = tls_client(&nats, &pki, ConnectOptions::new().tls_first()).await;
    hands_off(&client, &etcd, "first").await;
}

/// `setup`, `slots` and `loadgen` connect with the same settings as `run`:
/// against mutual-TLS servers they succeed with the files, and `setup`
/// without the client certificate fails with the one-line reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_slots_and_loadgen_use_the_same_tls_settings() {
    let pki = Pki::new();
    let nats = Nats::start_with_config(&pki.nats_tls_block("server", true, false));
    let etcd = Etcd::start_tls(&pki);
    let mut env = pki.nats_env("client");
    env.extend(pki.etcd_env());
    env.push(("HANDOFF_NATS__URL".into(), nats.url()));
    env.push(("HANDOFF_ETCD__ENDPOINTS".into(), etcd.endpoint()));
    let command = |args: &[&str], env: &[(String, String)]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .expect("run prefill-handoff");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, text) = block_in_place(|| command(&["setup"], &env));
    assert_eq!(code, Some(0), "setup: {text}");
    let without_cert: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| {
            !k.starts_with("HANDOFF_NATS__TLS__CERT") && !k.starts_with("HANDOFF_NATS__TLS__KEY")
        })
        .cloned()
        .collect();
    let (code, text) = block_in_place(|| command(&["setup"], &without_cert));
    assert_eq!(code, Some(1), "setup without a client certificate: {text}");
    assert!(text.contains("requires a client certificate"), "{text}");

    let _worker = spawn_worker(&nats, &etcd, Mode::Core, &env);
    let (code, text) = block_in_place(|| command(&["slots"], &env));
    assert_eq!(code, Some(0), "slots: {text}");
    assert!(text.contains("1 of 1021 slots claimed"), "slots: {text}");
    let (code, text) = block_in_place(|| {
        command(
            &["loadgen", "--count", "50", "--timeout", "30", "--quiet"],
            &env,
        )
    });
    assert_eq!(code, Some(0), "loadgen: {text}");
}
