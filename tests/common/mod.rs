//! The shared integration-test harness: real `nats-server` and `etcd`
//! processes on free loopback ports, in temporary directories, that a test can
//! kill and restart; and the worker binary as a child process.
//!
//! Every process is killed when its handle drops, so a failing test leaves
//! nothing running. Binaries: `HANDOFF_TEST_NATS_SERVER` (default: Debian's
//! `/usr/sbin/nats-server` when present, else `nats-server` on PATH),
//! `HANDOFF_TEST_ETCD` (default `etcd`).

pub mod cluster;
pub mod deadline_support;
pub mod fault_proxy;
pub mod fence;
pub mod jetstream_support;
pub mod messages;
pub mod otlp;
pub mod tls;
pub mod worker_support;

/// The setting under which a worker mints a missing `disagg_request_id`
/// (`trtllm.missing_disagg_request_id = "mint"`), for the harness's workers.
pub const MINT_ENV: (&str, &str) = ("HANDOFF_TRTLLM__MISSING_DISAGG_REQUEST_ID", "mint");
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts nats-server with the configuration file `conf` (stderr to `log`)
/// and waits until it listens on `port`; a server that does not is killed.
pub fn start_nats_server(conf: &Path, log: std::fs::File, port: u16, timeout: Duration) -> Child {
    let mut child = Command::new(nats_server_binary())
        .arg("-c")
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start nats-server (is it installed? scripts/install-deps.sh)");
    if !wait_for_port(port, timeout) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("nats-server did not listen on {port}");
    }
    child
}

/// A port that was free a moment ago on 127.0.0.1, for a server the test
/// starts (which binds it itself, so the port is released here).
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`), not
/// from it: a released port of that range can become the source port of any
/// outgoing connection on the machine, and the tests make thousands (1021
/// etcd clients at once, bursts), so a server could find its port taken
/// before it bound it (seen with 8 tests at once: "Address already in use").
/// Below the range only another listener can take it. Each test process
/// starts at a random point of the span and walks on from there, checking
/// that each port binds.
///
/// A port that binds here is released again, so a test process running at
/// the same time could pick it too before either server bound it (seen once:
/// a worker's metrics address "already in use"). Each port handed out is
/// therefore also reserved across processes by a marker file created with
/// `create_new` in a shared directory; a marker older than
/// [`PORT_RESERVATION`] is stale (its test is long over) and is taken over.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};

    const LOWEST: u32 = 10_000;
    static START: OnceLock<u32> = OnceLock::new();
    static TAKEN: AtomicU32 = AtomicU32::new(0);

    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if ephemeral_low <= LOWEST + 1_000 {
        // No room below the range on this machine: let the kernel choose.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
        return listener.local_addr().expect("local addr").port();
    }
    let span = ephemeral_low - LOWEST;
    let start = *START.get_or_init(|| {
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        (random % u64::from(span)) as u32
    });
    for _ in 0..span {
        let step = TAKEN.fetch_add(1, Ordering::Relaxed);
        let port = LOWEST + (start + step) % span;
        let port = u16::try_from(port).expect("below the ephemeral range");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && reserve_port(port) {
            return port;
        }
    }
    panic!("no free loopback port between {LOWEST} and {ephemeral_low}");
}

/// How long a port handed out by [`free_port`] stays reserved for the test
/// process that got it: longer than any one test runs.
const PORT_RESERVATION: Duration = Duration::from_secs(30 * 60);

/// Reserves `port` for this process against every other test process of this
/// machine (see [`free_port`]); false when another one holds it.
fn reserve_port(port: u16) -> bool {
    use std::fs::OpenOptions;
    use std::io::ErrorKind;

    let dir = std::env::temp_dir().join("prefill-handoff-test-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        // No shared directory: the bind check alone, as before.
        return true;
    }
    let marker = dir.join(port.to_string());
    let create = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker)
    };
    match create() {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let stale = std::fs::metadata(&marker)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age > PORT_RESERVATION);
            // Two processes may both see it stale: only the one whose
            // `create_new` wins after the removal takes the port.
            stale && std::fs::remove_file(&marker).is_ok() && create().is_ok()
        }
        Err(_) => true,
    }
}

/// How often [`poll_until`] and [`poll_until_blocking`] look again.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Waits until something accepts TCP connections on the port.
pub fn wait_for_port(port: u16, timeout: Duration) -> bool {
    poll_until_blocking(timeout, || TcpStream::connect(("127.0.0.1", port)).is_ok())
}

/// Runs `check` every 20 ms until it holds or `timeout` passes; whether it
/// held. The one way the tests wait for something: `check` is async, so it
/// can ask a server (consumer info, etcd) as well as read local state
/// (`|| async { seen.len() >= 2 }`), and the wait does not block the
/// runtime's thread, whose other tasks (a client's connection task) may be
/// what `check` waits for.
pub async fn poll_until<F: Future<Output = bool>>(
    timeout: Duration,
    mut check: impl FnMut() -> F,
) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// [`poll_until`] for blocking code: the harness's process handles and
/// tests with no runtime (in an async test, under `block_in_place`).
pub fn poll_until_blocking(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_EVERY);
    }
}

fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status();
}

pub fn nats_server_binary() -> PathBuf {
    if let Ok(p) = std::env::var("HANDOFF_TEST_NATS_SERVER") {
        return PathBuf::from(p);
    }
    let debian = Path::new("/usr/sbin/nats-server");
    if debian.exists() {
        return debian.to_path_buf();
    }
    PathBuf::from("nats-server")
}

/// A real nats-server with JetStream, storing in its own temporary directory.
pub struct Nats {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    max_payload: Option<usize>,
    /// More server configuration (a `tls { }` block, `authorization`, ...).
    extra: String,
    /// `(user, password)` every client must present.
    user: Option<(String, String)>,
}

impl Nats {
    pub fn start() -> Nats {
        Nats::start_with_max_payload(None)
    }

    /// Starts a server whose `max_payload` is raised (e.g. to test the
    /// worker's own `max_payload_bytes` limit with messages the server accepts).
    pub fn start_with_max_payload(max_payload: Option<usize>) -> Nats {
        let mut nats = Nats {
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
            max_payload,
            extra: String::new(),
            user: None,
        };
        nats.spawn();
        nats
    }

    /// Starts a server that accepts only clients authenticating as `user`
    /// with `password`.
    pub fn start_with_user(user: &str, password: &str) -> Nats {
        let mut nats = Nats::start_with_config(&format!(
            "authorization {{ user: {user:?}, password: {password:?} }}\n"
        ));
        nats.user = Some((user.to_string(), password.to_string()));
        nats
    }

    /// Starts a server with more configuration appended to its file.
    pub fn start_with_config(extra: &str) -> Nats {
        let mut nats = Nats {
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
            max_payload: None,
            extra: extra.to_string(),
            user: None,
        };
        nats.spawn();
        nats
    }

    fn spawn(&mut self) {
        let conf = self.dir.path().join("nats.conf");
        let store = self.dir.path().join("store");
        let mut text = format!(
            "listen: 127.0.0.1:{}\njetstream {{ store_dir: {:?} }}\n",
            self.port,
            store.display().to_string()
        );
        if let Some(max) = self.max_payload {
            text.push_str(&format!("max_payload: {max}\n"));
        }
        text.push_str(&self.extra);
        std::fs::write(&conf, text).expect("write nats.conf");
        let log = std::fs::File::create(self.dir.path().join("nats.log")).expect("log file");
        self.child = Some(start_nats_server(
            &conf,
            log,
            self.port,
            Duration::from_secs(15),
        ));
    }

    /// The server's address, for a proxy in front of it.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The URL without credentials.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The URL with the server's user and password written in it
    /// (`nats://user:password@host:port`), or [`Nats::url`] when it has none.
    pub fn url_with_user(&self) -> String {
        match &self.user {
            Some((user, password)) => format!("nats://{user}:{password}@127.0.0.1:{}", self.port),
            None => self.url(),
        }
    }

    /// SIGKILL: the server dies at once; its store directory is kept.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGTERM, wait for the exit, start again on the same port with the
    /// same store: a rolling restart. Tests that count every output across
    /// the restart use this one: a SIGKILLed single nats-server can lose
    /// messages it had already acknowledged (its file store writes them out
    /// shortly after the ack, and a stream stores a captured core publish
    /// after the publisher's PING round trip has returned), which no client
    /// can prevent. Crashes are covered where replication keeps acknowledged
    /// messages: the R3 stream-leader SIGKILL test in tests/cluster.
    pub fn restart_gracefully(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(&child, "TERM");
            poll_until_blocking(Duration::from_secs(30), || {
                !matches!(child.try_wait(), Ok(None))
            });
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
    }

    /// The server's version, from the `INFO` it greets a client with
    /// ("2.9.10"). Blocking.
    pub fn version(&self) -> String {
        use std::io::BufRead;
        let stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        let mut line = String::new();
        std::io::BufReader::new(stream)
            .read_line(&mut line)
            .expect("INFO line");
        let info: serde_json::Value = line
            .strip_prefix("INFO ")
            .and_then(|json| serde_json::from_str(json.trim()).ok())
            .unwrap_or_else(|| panic!("not an INFO line: {line:?}"));
        info["version"].as_str().expect("a version").to_string()
    }

    /// Publishes one message with exactly this header block, as a hostile
    /// publisher could: a raw TCP connection, `CONNECT` with headers, `HPUB`,
    /// then `PING` and waits for the `PONG`, so the server has routed the
    /// message on return. No client library checks the block. Blocking.
    pub fn raw_hpub(&self, subject: &str, header_block: &[u8], payload: &[u8]) {
        self.raw_hpub_with_reply(subject, None, header_block, payload);
    }

    /// [`Nats::raw_hpub`] with a reply subject, as a request would carry.
    pub fn raw_hpub_with_reply(
        &self,
        subject: &str,
        reply: Option<&str>,
        header_block: &[u8],
        payload: &[u8],
    ) {
        use std::io::{BufRead, BufReader, Write};
        let stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to nats-server");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let mut reader = BufReader::new(stream.try_clone().expect("clone the socket"));
        let mut line = String::new();
        reader.read_line(&mut line).expect("the server's INFO");
        assert!(line.starts_with("INFO "), "expected INFO, got {line:?}");
        let total = header_block.len() + payload.len();
        let reply = reply.map(|r| format!("{r} ")).unwrap_or_default();
        let mut ops = format!(
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1}}\r\n\
             HPUB {subject} {reply}{} {total}\r\n",
            header_block.len()
        )
        .into_bytes();
        ops.extend_from_slice(header_block);
        ops.extend_from_slice(payload);
        ops.extend_from_slice(b"\r\nPING\r\n");
        (&stream).write_all(&ops).expect("send HPUB");
        loop {
            line.clear();
            reader
                .read_line(&mut line)
                .expect("the server answers PING");
            assert!(!line.starts_with("-ERR"), "the server refused: {line:?}");
            if line.starts_with("PONG") {
                return;
            }
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A real single-member etcd in its own temporary directory.
pub struct Etcd {
    pub port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// `(server flags, etcdctl flags)` for `https://` with mutual TLS.
    tls: Option<(Vec<String>, Vec<String>)>,
}

impl Etcd {
    pub fn start() -> Etcd {
        Etcd::start_inner(None)
    }

    /// etcd over `https://` that requires a client certificate signed by the
    /// PKI's CA (`--client-cert-auth --trusted-ca-file`).
    pub fn start_tls(pki: &tls::Pki) -> Etcd {
        let server = vec![
            "--cert-file".into(),
            pki.path("server.pem"),
            "--key-file".into(),
            pki.path("server-key.pem"),
            "--client-cert-auth".into(),
            "--trusted-ca-file".into(),
            pki.path("ca.pem"),
        ];
        let ctl = vec![
            "--cacert".into(),
            pki.path("ca.pem"),
            "--cert".into(),
            pki.path("client.pem"),
            "--key".into(),
            pki.path("client-key.pem"),
        ];
        Etcd::start_inner(Some((server, ctl)))
    }

    fn start_inner(tls: Option<(Vec<String>, Vec<String>)>) -> Etcd {
        let mut etcd = Etcd {
            port: free_port(),
            peer_port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
            tls,
        };
        etcd.spawn();
        etcd
    }

    fn spawn(&mut self) {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let bin = std::env::var("HANDOFF_TEST_ETCD").unwrap_or_else(|_| "etcd".into());
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).expect("log file");
        let child = Command::new(bin)
            .args(["--name", "test", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("test={peer}")])
            .args(self.tls.iter().flat_map(|(server, _)| server))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd (is it installed? scripts/install-deps.sh)");
        self.child = Some(child);
        assert!(
            wait_for_port(self.port, Duration::from_secs(15)),
            "etcd did not listen on {}",
            self.port
        );
        // Listening is not serving: wait until a read succeeds.
        let ok = poll_until_blocking(Duration::from_secs(15), || {
            self.etcdctl(&["get", "/probe"]).is_some()
        });
        assert!(ok, "etcd on {} did not answer", self.port);
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Runs `etcdctl` (API v3) against this server; `None` when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(self.endpoint())
            .arg("--command-timeout=3s")
            .args(self.tls.iter().flat_map(|(_, ctl)| ctl))
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Keys (with values) under a prefix, as `(key, value)` pairs. Panics
    /// when `etcdctl` fails: an error must never read as "no keys".
    pub fn get_prefix(&self, prefix: &str) -> Vec<(String, String)> {
        let out = self
            .etcdctl(&["get", "--prefix", prefix])
            .unwrap_or_else(|| {
                panic!(
                    "etcdctl get --prefix {prefix} failed at {}",
                    self.endpoint()
                )
            });
        let lines: Vec<&str> = out.lines().collect();
        lines
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (c[0].to_string(), c[1].to_string()))
            .collect()
    }

    /// SIGKILL; the data directory is kept.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: etcd keeps its connections but answers nothing until
    /// [`Etcd::resume`].
    pub fn pause(&self) {
        if let Some(child) = &self.child {
            signal(child, "STOP");
        }
    }

    pub fn resume(&self) {
        if let Some(child) = &self.child {
            signal(child, "CONT");
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The worker binary (or any other subcommand) as a child process, with its
/// stderr and stdout captured to files the test can read.
pub struct Worker {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Worker {
    /// Starts `prefill-handoff` with the given arguments and environment.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Worker {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = std::fs::File::create(dir.path().join("worker.log")).expect("log file");
        let out = std::fs::File::create(dir.path().join("stdout.log")).expect("stdout file");
        let child = Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
            .args(args)
            // The test's own RUST_LOG, unless `env` sets one.
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            // The traffic of these tests has TensorRT-LLM results without
            // `disagg_request_id`, for the workers to mint (what the
            // identity tests check), unless `env` says otherwise.
            .env(MINT_ENV.0, MINT_ENV.1)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log)
            .spawn()
            .expect("start prefill-handoff");
        Worker {
            child: Some(child),
            dir,
        }
    }

    /// `run` against `nats_url` and `etcd`, configured by `HANDOFF_*`
    /// environment (`extra` added to the servers and a free metrics
    /// address), without waiting for it; returns it with its metrics
    /// address. For starts that may be refused as well as ones that serve.
    pub fn run_with_env(nats_url: &str, etcd: &Etcd, extra: &[(&str, &str)]) -> (Worker, String) {
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        let mut env = vec![
            ("HANDOFF_NATS__URL", nats_url.to_string()),
            ("HANDOFF_ETCD__ENDPOINTS", etcd.endpoint()),
            ("HANDOFF_METRICS_ADDR", metrics_addr.clone()),
            ("NO_COLOR", "1".to_string()),
        ];
        for (k, v) in extra {
            env.push((k, v.to_string()));
        }
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        (Worker::spawn(&["run"], &env), metrics_addr)
    }

    /// `prefill-handoff run` in `mode` against `nats` and `etcd`, with
    /// `--set` overrides and extra environment; returns it once `/readyz`
    /// answers 200 (within 30 s, generous for a loaded machine), with its
    /// metrics address. Blocking.
    pub fn run_ready(
        nats: &Nats,
        etcd: &Etcd,
        mode: &str,
        settings: &[&str],
        env: &[(&str, &str)],
    ) -> (Worker, String) {
        let metrics = format!("127.0.0.1:{}", free_port());
        let (nats_url, etcd_endpoint) = (nats.url(), etcd.endpoint());
        let mut args = vec![
            "run",
            "--mode",
            mode,
            "--nats-url",
            &nats_url,
            "--etcd-endpoints",
            &etcd_endpoint,
            "--metrics-addr",
            &metrics,
        ];
        for setting in settings {
            args.extend(["--set", setting]);
        }
        let mut env = env.to_vec();
        env.push(("NO_COLOR", "1"));
        let worker = Worker::spawn(&args, &env);
        let ready = poll_until_blocking(Duration::from_secs(30), || {
            http_send(&metrics, b"GET /readyz HTTP/1.1\r\n\r\n").is_ok_and(|r| r.status == 200)
        });
        assert!(ready, "the worker did not become ready:\n{}", worker.log());
        (worker, metrics)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("worker.log")).unwrap_or_default()
    }

    /// Everything the process wrote to stdout.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout.log")).unwrap_or_default()
    }

    /// Waits until the log contains `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        poll_until_blocking(timeout, || self.log().contains(needle))
    }

    pub fn sigterm(&self) {
        if let Some(child) = &self.child {
            signal(child, "TERM");
        }
    }

    /// Sends a signal by name (`USR1`, `STOP`, ...).
    pub fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            signal(child, sig);
        }
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the process to exit; its exit code, or `None` on timeout or
    /// death by signal.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        let mut exited = None;
        poll_until_blocking(timeout, || {
            exited = child.try_wait().ok().flatten();
            exited.is_some()
        });
        let status = exited?;
        self.child = None;
        status.code()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One HTTP answer, as read by [`http_send`].
#[derive(Debug, Clone)]
pub struct HttpReply {
    /// 0 when the answer had no parsable status line.
    pub status: u16,
    /// The status line and headers.
    pub head: String,
    pub body: String,
}

/// Sends raw bytes over a fresh TCP connection and reads until the server
/// closes it (the metrics server answers once, then closes). Blocking.
pub fn http_send(addr: impl std::net::ToSocketAddrs, raw: &[u8]) -> std::io::Result<HttpReply> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(raw)?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok(HttpReply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
}

/// `GET path`; panics when the connection fails. Blocking.
pub fn http_get(addr: impl std::net::ToSocketAddrs, path: &str) -> HttpReply {
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n");
    http_send(addr, request.as_bytes()).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Every sample of a Prometheus text exposition, by series (`name{labels}`).
pub fn prometheus_samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The results a worker has answered, by its metrics exposition: its
/// `handoff_outputs_total`, every outcome summed.
pub fn outputs_total(exposition: &str) -> u64 {
    let total: f64 = prometheus_samples(exposition)
        .iter()
        .filter(|(series, _)| series.starts_with("handoff_outputs_total{"))
        .map(|(_, value)| value)
        .sum();
    total as u64
}
