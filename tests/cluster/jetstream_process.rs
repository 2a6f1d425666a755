//! The durable mode as an operator runs it: `prefill-handoff run --mode
//! jetstream` processes against real nats-server and etcd. One worker is
//! killed with SIGKILL mid-run; etcd goes away and comes back.

use crate::common;
use crate::common::jetstream_support;

use common::{Etcd, Nats, Worker, poll_until_blocking};
use jetstream_support::*;
use prefill_handoff::ids::IdLayout;
use prefill_handoff::wire::{self, Encoding};
use std::time::Duration;

fn spawn_worker(nats: &Nats, etcd: &Etcd) -> Worker {
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let worker = Worker::spawn(
        &[
            "run",
            "--mode",
            "jetstream",
            "--nats-url",
            &nats.url(),
            "--etcd-endpoints",
            &etcd.endpoint(),
            "--metrics-addr",
            &metrics,
            "--lease-ttl-secs",
            "2",
            "--shutdown-timeout-secs",
            "5",
            "--set",
            "jetstream.ack_wait_secs=2",
            "--set",
            "jetstream.nak_delay_ms=100",
            "--set",
            "jetstream.max_deliver=100",
            "--set",
            "jetstream.batch=32",
            "--set",
            "max_in_flight=64",
        ],
        &[],
    );
    assert!(
        worker.wait_for_log("consuming from JetStream", Duration::from_secs(30)),
        "worker did not start:\n{}",
        worker.log()
    );
    worker
}

/// The claimed slots in etcd: (machine_id, lease as 16 hex digits).
fn slots(etcd: &Etcd) -> Vec<(u64, String)> {
    let out = etcd
        .etcdctl(&["get", "--prefix", "/llm/handoff/machine-ids/", "-w", "json"])
        .unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let mut slots = Vec::new();
    for kv in json["kvs"].as_array().cloned().unwrap_or_default() {
        let key = kv["key"].as_str().unwrap_or_default();
        // etcdctl's JSON holds keys base64-encoded.
        let key = String::from_utf8(base64_decode(key)).unwrap_or_default();
        let Some(id) = key.rsplit('/').next().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let lease = kv["lease"].as_i64().unwrap_or(0);
        slots.push((id, format!("{:016x}", lease as u64)));
    }
    slots
}

fn base64_decode(s: &str) -> Vec<u8> {
    let table = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(table) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_process_sigkill_of_one_of_three_workers_loses_nothing() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    capture_outputs(&js).await;
    let collector = Collector::start(&client).await;
    let mut doomed = spawn_worker(&nats, &etcd);
    let mut survivors = vec![spawn_worker(&nats, &etcd), spawn_worker(&nats, &etcd)];

    let n = 10_000;
    let inputs: Vec<Input> = (0..n).map(mixed).collect();
    let publisher = publish_in_background(&js, &inputs);
    assert!(collector.wait_for(n / 5, Duration::from_secs(60)).await);
    doomed.kill(); // SIGKILL
    println!("SIGKILLed one worker after {} outputs", collector.len());
    publisher.await.expect("publisher");

    assert!(
        wait_drained(&js, Duration::from_secs(120)).await,
        "work queue not drained: {}",
        queue_state(&js).await
    );
    check_stored(&js, &inputs, None, "after SIGKILL").await;
    let republished = collector
        .counts()
        .iter()
        .filter(|((_, kind), n)| *kind == Expect::Gen && **n > 1)
        .count();
    println!(
        "{republished} decode jobs were published more than once; the GEN stream stored each once"
    );
    assert_eq!(prefill_left(&js).await, 0);

    for w in &survivors {
        w.sigterm();
    }
    for w in &mut survivors {
        assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0), "{}", w.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_process_sigterm_under_load_exits_0_and_loses_nothing() {
    let nats = Nats::start();
    let etcd = Etcd::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    capture_outputs(&js).await;
    let collector = Collector::start(&client).await;
    let mut leaving = spawn_worker(&nats, &etcd);
    let mut staying = spawn_worker(&nats, &etcd);
    let slots_before = slots(&etcd);
    assert_eq!(slots_before.len(), 2);

    let n = 10_000;
    let inputs: Vec<Input> = (0..n).map(mixed).collect();
    let publisher = publish_in_background(&js, &inputs);
    assert!(collector.wait_for(n / 5, Duration::from_secs(60)).await);
    leaving.sigterm();
    // shutdown_timeout_secs is 5; a little slack for the lease revoke.
    assert_eq!(
        leaving.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        leaving.log()
    );
    assert_eq!(
        slots(&etcd).len(),
        1,
        "the leaving worker's slot is freed at once"
    );
    publisher.await.expect("publisher");

    assert!(
        wait_drained(&js, Duration::from_secs(120)).await,
        "work queue not drained: {}",
        queue_state(&js).await
    );
    check_stored(&js, &inputs, None, "after SIGTERM under load").await;
    staying.sigterm();
    assert_eq!(
        staying.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{}",
        staying.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_process_nats_server_restart_mid_run_loses_nothing() {
    let mut nats = Nats::start();
    let etcd = Etcd::start();
    let config = config(&nats);
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(nats.url())
        .await
        .expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    capture_outputs(&js).await;
    let collector = Collector::start(&client).await;
    let mut workers = vec![spawn_worker(&nats, &etcd), spawn_worker(&nats, &etcd)];

    restart_mid_run(&mut nats, &js, &collector, Duration::from_secs(90)).await;
    for w in &workers {
        w.sigterm();
    }
    for w in &mut workers {
        assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0), "{}", w.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_process_etcd_outage_past_the_reservation_defers_minting_until_etcd_returns() {
    let nats = Nats::start();
    let mut etcd = Etcd::start();
    let config = config(&nats);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    let collector = Collector::start(&client).await;
    let mut worker = spawn_worker(&nats, &etcd);
    let before = slots(&etcd);
    assert_eq!(before.len(), 1, "one worker, one slot: {before:?}");

    etcd.kill();
    assert!(
        worker.wait_for_log("keepalive failed", Duration::from_secs(15)),
        "{}",
        worker.log()
    );
    // Minting goes on within the reservation, at most one TTL (2 s) past the
    // last floor write: wait until it is surely used up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut inputs: Vec<Input> = (0..20)
        .map(|i| needs_mint(&format!("during-{i}")))
        .collect();
    inputs.extend((0..20).map(|i| Input::terminal(&format!("plain-{i}"))));
    publish_all(&js, &inputs).await;
    assert!(collector.wait_for(20, Duration::from_secs(20)).await);
    let redelivered = poll_until_blocking(Duration::from_secs(10), || {
        futures::executor::block_on(deliveries(&js)) > 40
    });
    assert!(
        redelivered,
        "results that need an ID are sent back while fenced"
    );
    assert!(
        collector.all().iter().all(|s| s.kind == Expect::Reply),
        "nothing needing an ID was published while fenced"
    );

    etcd.restart();
    assert!(
        collector.wait_for(40, Duration::from_secs(60)).await,
        "deferred results complete after etcd returns:\n{}",
        worker.log()
    );
    assert!(wait_drained(&js, Duration::from_secs(10)).await);
    // The same lease (a restarted etcd renews it) or a new one, if it
    // expired meanwhile: either way the slot held in etcd now.
    let after = slots(&etcd);
    assert_eq!(after.len(), 1, "one worker, one slot: {after:?}");
    let (new_slot, new_lease) = after[0].clone();
    for seen in collector.all().iter().filter(|s| s.kind == Expect::Gen) {
        let job = wire::decode(&seen.payload, Encoding::MsgPack).expect("job");
        let id = field(&job, "disagg_request_id")
            .and_then(|v| v.as_u64())
            .expect("minted");
        let worker_field = field(&job, "worker").expect("worker");
        let machine = field(worker_field, "machine_id").and_then(|v| v.as_u64());
        let instance = field(worker_field, "instance_id").and_then(|v| v.as_str());
        let decoded = IdLayout::Rc22.decode(id).expect("rc22");
        assert_eq!(
            (u64::from(decoded.machine_id), machine, instance),
            (new_slot, Some(new_slot), Some(new_lease.as_str())),
            "{}: minted with the slot held after etcd returned (before: {before:?})",
            seen.request_id
        );
    }
    worker.sigterm();
    assert_eq!(
        worker.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{}",
        worker.log()
    );
}
