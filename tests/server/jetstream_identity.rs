//! Durable mode with a real etcd identity (library level): while etcd is
//! down the worker mints within its reservation; once that is used up,
//! results that need a request ID wait (nak with delay) and complete after
//! etcd returns, with IDs from the slot held in etcd then. Results that need
//! no ID flow on.

use crate::common;
use crate::common::jetstream_support;

use common::{Etcd, Nats, poll_until_blocking};
use jetstream_support::*;
use prefill_handoff::identity::{Lease, Registration};
use prefill_handoff::ids::IdLayout;
use prefill_handoff::wire::{self, Encoding};
use std::time::{Duration, Instant};

/// (request ID, minted disagg_request_id, worker.machine_id, worker.instance_id)
fn jobs(collector: &Collector, prefix: &str) -> Vec<(String, u64, u64, String)> {
    collector
        .all()
        .into_iter()
        .filter(|s| s.kind == Expect::Gen && s.request_id.starts_with(prefix))
        .map(|s| {
            let job = wire::decode(&s.payload, Encoding::MsgPack).expect("decode job");
            let id = field(&job, "disagg_request_id")
                .and_then(|v| v.as_u64())
                .expect("minted disagg_request_id");
            let worker = field(&job, "worker").expect("worker");
            let machine = field(worker, "machine_id")
                .and_then(|v| v.as_u64())
                .expect("worker.machine_id");
            let instance = field(worker, "instance_id")
                .and_then(|v| v.as_str())
                .expect("worker.instance_id")
                .to_string();
            (s.request_id, id, machine, instance)
        })
        .collect()
}

/// The lease (16 hex digits) that holds a slot key in etcd, if any.
fn slot_holder(etcd: &Etcd, machine_id: u64) -> Option<String> {
    let key = format!("/llm/handoff/machine-ids/{machine_id}");
    let out = etcd.etcdctl(&["get", &key, "-w", "json"])?;
    let json: serde_json::Value = serde_json::from_str(&out).ok()?;
    let lease = json["kvs"][0]["lease"].as_i64()?;
    Some(format!("{:016x}", lease as u64))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_etcd_outage_past_the_reservation_defers_minting_until_etcd_returns() {
    let nats = Nats::start();
    let mut etcd = Etcd::start();
    let mut config = config(&nats);
    config.etcd.endpoints = etcd.endpoint();
    config.lease_ttl_secs = 2;
    config.etcd.connect_timeout_ms = 500;
    config.etcd.request_timeout_ms = 500;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    setup(&js, &config).await;
    let collector = Collector::start(&client).await;

    let lease = Lease::start(&config, Registration::default())
        .await
        .expect("lease");
    let identity = lease.identity();
    let before = identity.state();
    let (old_slot, old_lease) = (
        u64::from(before.machine_id.expect("slot").get()),
        format!("{:016x}", before.lease_id.expect("lease") as u64),
    );
    let worker = LibWorker::start(&config, identity.clone()).await;

    // Before the outage: minted with the slot held.
    let first: Vec<Input> = (0..20)
        .map(|i| needs_mint(&format!("before-{i}")))
        .collect();
    publish_all(&js, &first).await;
    assert!(collector.wait_for(20, Duration::from_secs(20)).await);
    for (id, _, machine, instance) in jobs(&collector, "before-") {
        assert_eq!((machine, &instance), (old_slot, &old_lease), "{id}");
    }

    etcd.kill();
    let used_up = poll_until_blocking(Duration::from_secs(15), || {
        identity.reserved_for_ms() == Some(0)
    });
    assert!(used_up, "the reservation runs out while etcd is gone");
    assert!(
        identity.mint_many(1).is_err(),
        "past the reservation: no ID"
    );

    let mut during: Vec<Input> = (0..20)
        .map(|i| needs_mint(&format!("during-{i}")))
        .collect();
    during.extend((0..20).map(|i| Input::terminal(&format!("plain-{i}"))));
    let published_at = Instant::now();
    publish_all(&js, &during).await;
    // Results that need no ID flow while fenced.
    assert!(collector.wait_for(40, Duration::from_secs(20)).await);
    let plain = collector
        .all()
        .iter()
        .filter(|s| s.request_id.starts_with("plain-"))
        .count();
    assert_eq!(plain, 20);
    // The others were tried and sent back, not answered.
    let tried = poll_until_blocking(Duration::from_secs(10), || {
        futures::executor::block_on(deliveries(&js)) > 60
    });
    assert!(tried, "fenced results are redelivered");
    assert!(
        jobs(&collector, "during-").is_empty(),
        "no decode job past the reservation"
    );
    assert!(identity.mint_many(1).is_err(), "etcd is still down");
    println!(
        "past the reservation for {:?} so far; restarting etcd",
        published_at.elapsed()
    );

    etcd.restart();
    // The same lease (a restarted etcd renews it) or a new one: either way
    // minting resumes without a restart of the worker.
    let recovered = poll_until_blocking(Duration::from_secs(30), || {
        identity.reserved_for_ms().is_some_and(|ms| ms > 0)
    });
    assert!(recovered, "a renewed reservation after etcd returns");
    assert!(
        collector.wait_for(60, Duration::from_secs(60)).await,
        "the deferred results complete"
    );
    assert!(wait_drained(&js, Duration::from_secs(10)).await);

    let after = identity.state();
    let new_slot = u64::from(after.machine_id.expect("slot").get());
    let new_lease = format!("{:016x}", after.lease_id.expect("lease") as u64);
    let deferred = jobs(&collector, "during-");
    assert_eq!(deferred.len(), 20, "each deferred result once");
    for (id, disagg, machine, instance) in deferred {
        let decoded = IdLayout::Rc22.decode(disagg).expect("rc22");
        assert_eq!(
            (u64::from(decoded.machine_id), machine, instance.as_str()),
            (new_slot, new_slot, new_lease.as_str()),
            "{id}: minted with the slot held after etcd returned"
        );
    }
    assert_eq!(
        slot_holder(&etcd, new_slot).as_deref(),
        Some(new_lease.as_str()),
        "the slot the IDs came from is held by the new lease in etcd"
    );
    println!(
        "slot {old_slot} (lease {old_lease}) before; minted with slot {new_slot} (lease {new_lease}) after"
    );

    worker.stop().await.expect("stop");
    lease.shutdown().await;
}
