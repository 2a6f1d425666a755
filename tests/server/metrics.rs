//! `/metrics`, `/healthz` and `/readyz` over real TCP, with the readiness fed
//! by a real nats-server connection and an identity that is fenced and
//! recovered.

use crate::common;

use common::{HttpReply, Nats};
use prefill_handoff::decision::{Backend, DeadLetterCode, ErrorCode, FinishReason, Outcome};
use prefill_handoff::identity::Identity;
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout, MachineId};
use prefill_handoff::metrics::{self, Metrics, Readiness, Server};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `common::http_send` off the runtime's threads.
async fn send(addr: SocketAddr, raw: &[u8]) -> std::io::Result<HttpReply> {
    let raw = raw.to_vec();
    tokio::task::spawn_blocking(move || common::http_send(addr, &raw))
        .await
        .expect("the HTTP client thread")
}

async fn get(addr: SocketAddr, path: &str) -> HttpReply {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || common::http_get(addr, &path))
        .await
        .expect("the HTTP client thread")
}

/// Every sample of a `/metrics` scrape, by series.
async fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let reply = get(addr, "/metrics").await;
    assert_eq!(reply.status, 200);
    assert!(
        reply
            .head
            .contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
        "{}",
        reply.head
    );
    common::prometheus_samples(&reply.body)
}

/// How long the metrics tests wait for a gauge or the readiness to follow.
const WAIT: Duration = Duration::from_secs(30);

fn unfenced_identity() -> Identity {
    Identity::fixed(
        IdLayout::Rc22,
        DEFAULT_EPOCH_UNIX_MS,
        MachineId::new(1).unwrap(),
    )
}

async fn start(metrics: &Metrics, readiness: &Readiness) -> Server {
    metrics::serve(
        "127.0.0.1:0",
        metrics.clone(),
        readiness.clone(),
        std::future::pending(),
    )
    .await
    .expect("bind the metrics server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_outcome_moves_exactly_its_series() {
    type Case = (Outcome, usize, Vec<(String, f64)>);
    let metrics = Metrics::new();
    let server = start(&metrics, &Readiness::new(unfenced_identity().watch())).await;
    let addr = server.local_addr;
    let decode = |backend, minted| Outcome::Decode { backend, minted };
    let terminal = |finish_reason| Outcome::Terminal { finish_reason };
    let error = |code| Outcome::Error { code };
    let dead = |code| Outcome::DeadLetter { code };
    let jobs = |b: &str| format!("handoff_decode_jobs_total{{backend=\"{b}\"}}");
    let trailing_total = "handoff_trailing_frames_ignored_total".to_string();
    // (outcome, trailing frames, the series besides outputs_total that move, by how much)
    let mut cases: Vec<Case> = vec![
        (
            decode(Backend::Trtllm, true),
            0,
            vec![
                (jobs("trtllm"), 1.0),
                (
                    "handoff_ids_minted_total{source=\"decode_job\"}".into(),
                    1.0,
                ),
            ],
        ),
        (
            decode(Backend::Trtllm, false),
            0,
            vec![(jobs("trtllm"), 1.0)],
        ),
        (
            decode(Backend::Sglang, false),
            3,
            vec![(jobs("sglang"), 1.0), (trailing_total.clone(), 3.0)],
        ),
        (decode(Backend::Vllm, false), 0, vec![(jobs("vllm"), 1.0)]),
        (
            decode(Backend::Opaque, false),
            0,
            vec![(jobs("opaque"), 1.0)],
        ),
        (
            terminal(FinishReason::Eos),
            1,
            vec![
                ("handoff_terminal_total{finish_reason=\"eos\"}".into(), 1.0),
                (trailing_total.clone(), 1.0),
            ],
        ),
        (
            terminal(FinishReason::from_label("weird")),
            0,
            vec![(
                "handoff_terminal_total{finish_reason=\"other\"}".into(),
                1.0,
            )],
        ),
    ];
    for code in [
        ErrorCode::MissingCtxRequestId,
        ErrorCode::IdentityUnavailable,
    ] {
        let series = format!("handoff_error_responses_total{{code=\"{code}\"}}");
        cases.push((error(code), 0, vec![(series, 1.0)]));
    }
    for code in [DeadLetterCode::TooLarge, DeadLetterCode::MissingReplyTo] {
        let series = format!("handoff_dead_letters_total{{code=\"{code}\"}}");
        cases.push((dead(code), 0, vec![(series, 1.0)]));
    }
    for (outcome, trailing, moves) in cases {
        let before = scrape(addr).await;
        // 3 ms: lands in the 5 ms bucket and every bucket above it.
        metrics.record(&outcome, trailing, Duration::from_millis(3));
        let after = scrape(addr).await;
        assert_eq!(
            before.keys().collect::<Vec<_>>(),
            after.keys().collect::<Vec<_>>()
        );

        let mut want: BTreeMap<String, f64> = moves.into_iter().collect();
        want.insert(
            format!("handoff_outputs_total{{outcome=\"{}\"}}", outcome.kind()),
            1.0,
        );
        want.insert("handoff_latency_seconds_count".into(), 1.0);
        want.insert("handoff_latency_seconds_sum".into(), 0.003);
        for le in [
            "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "+Inf",
        ] {
            want.insert(
                format!("handoff_latency_seconds_bucket{{le=\"{le}\"}}"),
                1.0,
            );
        }
        let moved: BTreeMap<String, f64> = after
            .iter()
            .map(|(series, v)| (series.clone(), v - before[series]))
            .filter(|(_, delta)| delta.abs() > 1e-12)
            .collect();
        assert_eq!(
            moved.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{outcome:?}"
        );
        for (series, delta) in &want {
            assert!(
                (moved[series] - delta).abs() < 1e-9,
                "{outcome:?}: {series} moved by {}",
                moved[series]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_ok_and_head_has_no_body() {
    let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    let server = start(&Metrics::new(), &Readiness::new(identity.watch())).await;
    let reply = get(server.local_addr, "/healthz").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, "ok\n");
    assert!(reply.head.contains("Connection: close"), "{}", reply.head);

    let head = send(server.local_addr, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(head.body, "");
    assert_eq!(get(server.local_addr, "/nothing-here").await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_needs_nats_a_slot_and_consuming() {
    let mut nats = Nats::start();
    let metrics = Metrics::new();
    let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    metrics.watch_identity(identity.watch());
    let readiness = Readiness::new(identity.watch());
    let server = start(&metrics, &readiness).await;
    let addr = server.local_addr;

    let readyz = || async move { get(addr, "/readyz").await };
    let reply = readyz().await;
    assert_eq!(reply.status, 503);
    let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(body["ready"], false);
    assert_eq!(
        body["missing"],
        serde_json::json!(["nats_connected", "slot_held", "consuming"])
    );

    let _client = async_nats::ConnectOptions::new()
        .event_callback(metrics::on_nats_event(metrics.clone(), readiness.clone()))
        .connect(nats.url())
        .await
        .expect("connect");
    readiness.set_consuming(true);
    assert!(
        common::poll_until(WAIT, || async move {
            readyz().await.body.contains(r#""missing":["slot_held"]"#)
        })
        .await,
        "timed out waiting until only the slot is missing"
    );
    let s = scrape(addr).await;
    assert_eq!(s["handoff_fenced"], 1.0);
    assert_eq!(s["handoff_machine_id"], -1.0);

    // A slot is claimed: ready.
    identity.install(
        0x10,
        MachineId::new(16).unwrap(),
        Some(Instant::now() + Duration::from_secs(60)),
    );
    assert!(
        common::poll_until(WAIT, || async move { readyz().await.status == 200 }).await,
        "timed out waiting until ready after install"
    );
    assert!(
        common::poll_until(WAIT, || async move {
            let s = scrape(addr).await;
            s["handoff_fenced"] == 0.0 && s["handoff_machine_id"] == 16.0
        })
        .await,
        "timed out waiting until gauges follow the slot"
    );
    assert_eq!(scrape(addr).await["handoff_lease_recoveries_total"], 0.0);

    // The lease is lost: not ready, fenced.
    identity.fence();
    let reply = readyz().await;
    assert_eq!(reply.status, 503);
    assert!(
        reply.body.contains(r#""missing":["slot_held"]"#),
        "{}",
        reply.body
    );
    assert!(
        common::poll_until(WAIT, || async move {
            let s = scrape(addr).await;
            s["handoff_fenced"] == 1.0 && s["handoff_machine_id"] == -1.0
        })
        .await,
        "timed out waiting until fenced gauge"
    );

    // Recovered with a new lease and slot: ready again, one recovery.
    identity.set_lease(0x20);
    identity.install(
        0x20,
        MachineId::new(32).unwrap(),
        Some(Instant::now() + Duration::from_secs(60)),
    );
    assert!(
        common::poll_until(WAIT, || async move { readyz().await.status == 200 }).await,
        "timed out waiting until ready after recovery"
    );
    assert!(
        common::poll_until(WAIT, || async move {
            let s = scrape(addr).await;
            s["handoff_lease_recoveries_total"] == 1.0 && s["handoff_machine_id"] == 32.0
        })
        .await,
        "timed out waiting until one recovery counted"
    );

    // NATS goes away: not ready; it comes back: ready, one reconnect.
    nats.kill();
    assert!(
        common::poll_until(WAIT, || async move {
            readyz()
                .await
                .body
                .contains(r#""missing":["nats_connected"]"#)
        })
        .await,
        "timed out waiting until not ready without NATS"
    );
    nats.restart();
    assert!(
        common::poll_until(WAIT, || async move { readyz().await.status == 200 }).await,
        "timed out waiting until ready after reconnect"
    );
    assert_eq!(scrape(addr).await["handoff_nats_reconnects_total"], 1.0);

    // Draining: not consuming any more.
    readiness.set_consuming(false);
    assert!(readyz().await.body.contains(r#""missing":["consuming"]"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_never_stops_the_server() {
    let server = start(
        &Metrics::new(),
        &Readiness::new(unfenced_identity().watch()),
    )
    .await;
    let addr = server.local_addr;

    // A client that connects and never sends anything must not block others.
    let _silent = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /metr").await.unwrap();

    let huge = vec![b'A'; 64 * 1024];
    let mut long_header = b"GET /healthz HTTP/1.1\r\nX-Junk: ".to_vec();
    long_header.extend(vec![b'x'; 20_000]);
    long_header.extend(b"\r\n\r\n");
    // (bytes sent, the status expected when an answer arrives; 0: any or none)
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (b"\x00\x01\x02\x03\xff\xfe\r\n\r\n".to_vec(), 400),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n".to_vec(),
            400,
        ),
        (b"GET\r\n\r\n".to_vec(), 400),
        (b"GET / HTTP/9.9\r\n\r\n".to_vec(), 400),
        (
            b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
            405,
        ),
        (b"GET /../../etc/passwd HTTP/1.1\r\n\r\n".to_vec(), 404),
        (b"\r\n\r\n\r\n\r\n".to_vec(), 400),
        (huge, 0),
        (long_header, 0),
    ];
    for (bytes, want) in cases {
        // Large inputs may be cut off with a reset; only the server's survival matters then.
        let got = send(addr, &bytes).await;
        if want != 0 {
            let reply =
                got.unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(&bytes)));
            assert_eq!(reply.status, want, "{:?}", String::from_utf8_lossy(&bytes));
        } else if let Ok(reply) = got {
            assert!(reply.status == 431 || reply.status == 0, "{}", reply.head);
        }
        assert_eq!(get(addr, "/healthz").await.status, 200);
    }
    // A client that sends half a request and closes gets an answer, not a hang.
    let mut cut = TcpStream::connect(addr).await.unwrap();
    cut.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    cut.shutdown().await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), cut.read_to_end(&mut out))
        .await
        .expect("an answer")
        .expect("read");
    assert!(
        out.starts_with(b"HTTP/1.1 200 OK\r\n"),
        "{}",
        String::from_utf8_lossy(&out)
    );

    assert_eq!(get(addr, "/healthz").await.status, 200);
    drop(half);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_address_is_reported_as_metrics_addr() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    let err = metrics::serve(
        &addr,
        Metrics::new(),
        Readiness::new(identity.watch()),
        std::future::pending(),
    )
    .await
    .err()
    .expect("the address is taken");
    let message = err.to_string();
    assert!(
        message.contains("metrics_addr") && message.contains(&addr),
        "{message}"
    );

    let err = metrics::serve(
        "not an address",
        Metrics::new(),
        Readiness::new(identity.watch()),
        std::future::pending(),
    )
    .await
    .err()
    .expect("not an address");
    assert!(err.to_string().contains("metrics_addr"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_stops_on_shutdown() {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    let server = metrics::serve(
        "127.0.0.1:0",
        Metrics::new(),
        Readiness::new(identity.watch()),
        async {
            let _ = stopped.await;
        },
    )
    .await
    .unwrap();
    let addr = server.local_addr;
    assert_eq!(get(addr, "/healthz").await.status, 200);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server.task)
        .await
        .expect("the server task ends")
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "nothing listens after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_the_client_drops_for_a_full_buffer_are_counted() {
    let nats = Nats::start();
    let metrics = Metrics::new();
    let readiness = Readiness::new(unfenced_identity().watch());
    let server = start(&metrics, &readiness).await;
    let addr = server.local_addr;
    // The worker's own connection, with room for one message per subscription.
    let config = prefill_handoff::config::NatsConfig {
        url: nats.url(),
        subscription_capacity: 1,
        ..Default::default()
    };
    let worker_side = prefill_handoff::connect::connect(&config, metrics.clone(), readiness)
        .await
        .expect("connect");
    let _never_read = worker_side
        .subscribe("drops.test")
        .await
        .expect("subscribe");
    worker_side.flush().await.expect("flush");
    assert_eq!(
        scrape(addr).await["handoff_nats_slow_consumer_drops_total"],
        0.0
    );

    let publisher = async_nats::connect(nats.url()).await.expect("connect");
    for i in 0..20u32 {
        publisher
            .publish("drops.test", i.to_string().into())
            .await
            .expect("publish");
    }
    publisher.flush().await.expect("flush");
    // One message fits the buffer; the client drops the others and reports
    // each drop it can (its event queue is bounded).
    assert!(
        common::poll_until(WAIT, || async move {
            let dropped = scrape(addr).await["handoff_nats_slow_consumer_drops_total"];
            (1.0..=19.0).contains(&dropped)
        })
        .await,
        "timed out waiting until drops counted"
    );
}
