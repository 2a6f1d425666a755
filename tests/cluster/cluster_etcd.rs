//! The identity on a 3-member etcd: a leader election under load is
//! invisible to clients, and a full fleet of 1021 identities claims every
//! slot at once.

use crate::common;
use crate::common::worker_support;

use common::cluster::EtcdCluster;
use common::messages::{decode_output, msgpack};
use common::{Nats, poll_until_blocking};
use etcd_client::{Client, EventType};
use prefill_handoff::config::{Config, EtcdConfig};
use prefill_handoff::identity::{Lease, LeaseError, Registration};
use prefill_handoff::ids::IdLayout;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};
use worker_support::{Collector, GEN, InProcess, PREFILL, client};

const SLOTS: &str = "/llm/handoff/machine-ids/";

fn identity_config(etcd: &EtcdCluster, nats_url: &str, ttl: u64) -> Config {
    let mut config = worker_support::config(nats_url);
    config.etcd = EtcdConfig {
        endpoints: etcd.endpoints(),
        ..EtcdConfig::default()
    };
    config.lease_ttl_secs = ttl;
    config.resolve().expect("test config resolves")
}

/// Every (slot, lease as 16 hex digits) pair that was ever written to a slot
/// key, read from etcd's history (the test cluster is never compacted).
async fn slot_history(etcd: &EtcdCluster) -> HashSet<(u64, String)> {
    let endpoints: Vec<String> = etcd.endpoints().split(',').map(str::to_string).collect();
    let mut c = Client::connect(endpoints, None).await.expect("connect");
    let mut stream = c
        .watch(
            SLOTS,
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(1),
            ),
        )
        .await
        .expect("watch the slot history");
    let mut pairs = HashSet::new();
    // History arrives in batches; it is complete once the stream stays idle.
    while let Ok(answer) = tokio::time::timeout(Duration::from_secs(2), stream.message()).await {
        let answer = answer.expect("watch").expect("open");
        for event in answer.events() {
            if event.event_type() != EventType::Put {
                continue;
            }
            let Some(kv) = event.kv() else { continue };
            let slot: u64 = kv.key_str().expect("utf-8")[SLOTS.len()..]
                .parse()
                .expect("a slot number");
            pairs.insert((slot, kv.value_str().expect("utf-8").to_string()));
        }
    }
    pairs
}

/// A TensorRT-LLM prefill result whose decode job needs a minted ID, or
/// (every third) a finished one answered directly.
fn result(i: usize) -> Vec<u8> {
    let params = json!({"ctx_request_id": i, "request_type": "context_only"});
    let finish = if i.is_multiple_of(3) {
        json!("eos")
    } else {
        Value::Null
    };
    msgpack(&json!({
        "request_id": format!("r{i}"),
        "reply_to": format!("llm.replies.{i}"),
        "frames": [{"token_ids": [1], "finish_reason": finish, "disaggregated_params": params}],
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_etcd_leader_killed_under_load_is_invisible_to_clients() {
    const RESULTS: usize = 4500;
    const RATE: u64 = 300;
    let nats = Nats::start();
    let mut etcd = EtcdCluster::start();
    let config = identity_config(&etcd, &nats.url(), 5);
    let test = client(&nats.url()).await;
    let collector = Collector::start(&test).await;

    let mut leases = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let lease = Lease::start(&config, Registration::default())
            .await
            .expect("the lease starts");
        workers.push(InProcess::start(&config, lease.identity()).await);
        leases.push(lease);
    }

    let started = Instant::now();
    let mut killed = None;
    for i in 0..RESULTS {
        // 300 results/s, paced against the start so a slow publish catches up.
        let due = started + Duration::from_micros(i as u64 * 1_000_000 / RATE);
        tokio::time::sleep_until(due.into()).await;
        if i == RESULTS / 3 {
            let leader = etcd.leader().expect("the etcd cluster has a leader");
            etcd.kill(leader);
            eprintln!("etcd leader e{leader} SIGKILLed after {i} results");
            killed = Some((leader, Instant::now()));
        }
        if i == 2 * RESULTS / 3 {
            let (leader, at) = killed.expect("killed before");
            etcd.restart(leader);
            eprintln!(
                "e{leader} restarted {:.1} s after the kill",
                at.elapsed().as_secs_f64()
            );
        }
        test.publish(PREFILL, result(i).into())
            .await
            .expect("publish");
    }
    let settled = || async {
        for worker in &workers {
            if !worker.settled().await {
                return false;
            }
        }
        true
    };
    let outputs = collector
        .wait_outputs(RESULTS, Duration::from_secs(60), settled)
        .await;

    // Every result has its one output, and none is identity_unavailable.
    let mut per_request: HashMap<String, usize> = HashMap::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let mut minted = Vec::new();
    for message in &outputs {
        let body = decode_output(message);
        if body["kind"] == "error" {
            *errors
                .entry(body["error"]["code"].as_str().unwrap_or("?").to_string())
                .or_default() += 1;
        }
        if message.subject.as_str() == GEN {
            let id = body["disagg_request_id"].as_u64().expect("a minted ID");
            let machine_id = body["worker"]["machine_id"].as_u64().expect("a slot");
            let instance = body["worker"]["instance_id"]
                .as_str()
                .expect("an instance")
                .to_string();
            minted.push((id, machine_id, instance));
        }
        *per_request
            .entry(body["request_id"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    assert!(errors.is_empty(), "error replies: {errors:?}");
    let repeated: Vec<_> = per_request.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        repeated.is_empty(),
        "requests with other than one output: {repeated:?}"
    );
    assert_eq!(per_request.len(), RESULTS, "every result answered");

    // Every minted ID is distinct and decodes to a slot its worker held.
    let distinct: HashSet<u64> = minted.iter().map(|m| m.0).collect();
    assert_eq!(distinct.len(), minted.len(), "a minted ID repeated");
    let held = slot_history(&etcd).await;
    for (id, machine_id, instance) in &minted {
        let decoded = IdLayout::Rc22.decode(*id).expect("a minted ID decodes");
        assert_eq!(u64::from(decoded.machine_id), *machine_id, "{id}");
        assert!(
            held.contains(&(*machine_id, instance.clone())),
            "{id}: slot {machine_id} was never held by {instance}; held: {held:?}"
        );
    }
    let recoveries: Vec<u64> = leases.iter().map(|l| l.recoveries().get()).collect();
    eprintln!(
        "{} results, {} minted IDs, slot holders over the run: {}, recoveries {recoveries:?}",
        RESULTS,
        minted.len(),
        held.len()
    );
    for worker in workers {
        worker.stop().await;
    }
    for lease in leases {
        lease.shutdown().await;
    }
}

/// How many slot keys etcd holds; panics when `etcdctl` fails.
fn slot_keys(etcd: &EtcdCluster) -> usize {
    etcd.etcdctl_checked(&["get", "--prefix", SLOTS, "--keys-only"])
        .lines()
        .filter(|l| !l.is_empty())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_fleet_of_1021_identities_claims_every_slot_once() {
    let etcd = EtcdCluster::start();
    // A TTL no part of the test comes near: every slot key that vanishes
    // was revoked, none expired.
    let mut config = identity_config(&etcd, "nats://127.0.0.1:4222", 900);
    // 1021 claims at once, and then 1021 floor writes and revokes, queue up
    // at etcd: give each request time. With 20 s, on a machine whose CPU
    // was two-thirds taken by its neighbours (claims in 76 s instead of
    // 23 s), some revokes gave up and their slots outlived the test's wait.
    config.etcd.request_timeout_ms = 60_000;
    config.etcd.connect_timeout_ms = 20_000;
    let started = Instant::now();
    let claims: Vec<_> = (0..1021)
        .map(|_| {
            let config = config.clone();
            tokio::spawn(async move {
                // As a supervisor would restart a worker whose start failed
                // for want of an answer: 3063 connections at once on a
                // loopback etcd may see some cancelled. Counted and printed.
                let mut retries = 0;
                loop {
                    match Lease::start(&config, Registration::default()).await {
                        Err(LeaseError::Etcd(e)) if retries < 5 => {
                            eprintln!("start failed, retrying: {e}");
                            retries += 1;
                        }
                        other => return other.map(|lease| (lease, retries)),
                    }
                }
            })
        })
        .collect();
    let mut leases = Vec::new();
    let mut retries = 0;
    for claim in futures::future::join_all(claims).await {
        let (lease, tries) = claim.expect("no panic").expect("a slot for each of 1021");
        leases.push(lease);
        retries += tries;
    }
    let took = started.elapsed();
    let slots: HashSet<u16> = leases
        .iter()
        .map(|l| l.identity().state().machine_id.expect("a slot").get())
        .collect();
    assert_eq!(slots.len(), 1021, "1021 distinct slots");
    eprintln!(
        "1021 identities claimed 1021 distinct slots in {:.1} s ({retries} starts retried)",
        took.as_secs_f64()
    );

    let refused = Lease::start(&config, Registration::default()).await;
    match refused {
        Err(e @ LeaseError::SlotsExhausted { .. }) => {
            assert!(e.to_string().contains("all 1021"), "{e}");
        }
        Err(other) => panic!("the 1022nd got another error: {other}"),
        Ok(_) => panic!("the 1022nd got a slot"),
    }
    assert_eq!(slot_keys(&etcd), 1021);
    // For the failure message: a lease that lost its slot during the run
    // and is still recovering when shut down is the likeliest leftover.
    let recovered: u64 = leases.iter().map(|l| l.recoveries().get()).sum();
    let stopping = Instant::now();
    futures::future::join_all(leases.into_iter().map(Lease::shutdown)).await;
    let shutdown_took = stopping.elapsed();
    if !poll_until_blocking(Duration::from_secs(60), || slot_keys(&etcd) == 0) {
        let left = etcd.etcdctl_checked(&["get", "--prefix", SLOTS]);
        panic!(
            "every slot freed on shutdown: {} slot keys left 60 s after a shutdown that took {:.1} s ({recovered} leases recovered during the run); the first: {:?}",
            slot_keys(&etcd),
            shutdown_took.as_secs_f64(),
            left.lines().take(6).collect::<Vec<_>>()
        );
    }
    eprintln!(
        "and freed them in {:.1} s",
        stopping.elapsed().as_secs_f64()
    );
}

/// Claims `slots` under a new lease of the test's own; returns the lease.
async fn preclaim(c: &mut Client, slots: &[u16]) -> i64 {
    use etcd_client::{PutOptions, Txn, TxnOp};
    let lease = c.lease_grant(300, None).await.expect("grant").id();
    for batch in slots.chunks(100) {
        let ops: Vec<TxnOp> = batch
            .iter()
            .map(|m| {
                TxnOp::put(
                    format!("{SLOTS}{m}"),
                    format!("{lease:016x}"),
                    Some(PutOptions::new().with_lease(lease)),
                )
            })
            .collect();
        c.txn(Txn::new().and_then(ops)).await.expect("pre-claim");
    }
    lease
}

/// A worker cut off from etcd (its only endpoint is a member that died)
/// mints until its reservation is used up, then answers identity_unavailable;
/// meanwhile its lease expires and another worker, whose clock is 5 s
/// behind, takes its slot. When the member returns, the cut-off worker
/// learns its lease is gone and claims a new slot without a restart. No ID
/// repeats across the outage, between the two workers or within either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_cut_off_from_etcd_mints_to_the_end_of_its_reservation_and_resumes_when_etcd_returns()
 {
    const SLOT: u16 = 300;
    const SPARE: u16 = 301;
    let mut etcd = EtcdCluster::start();
    let endpoints: Vec<String> = etcd.endpoints().split(',').map(str::to_string).collect();
    let mut c = Client::connect(endpoints, None).await.expect("connect");
    let others: Vec<u16> = (0..1021).filter(|m| *m != SLOT && *m != SPARE).collect();
    preclaim(&mut c, &others).await;
    let spare = preclaim(&mut c, &[SPARE]).await;

    // A talks to e0 only, B to e1 and e2 only, with a clock 5 s behind.
    // A's reservation runs 10 s past its last floor write.
    let mut config_a = identity_config(&etcd, "nats://127.0.0.1:4222", 10);
    config_a.etcd.endpoints = etcd.endpoint(0);
    config_a.etcd.request_timeout_ms = 500;
    let mut config_b = identity_config(&etcd, "nats://127.0.0.1:4222", 3);
    config_b.etcd.endpoints = format!("{},{}", etcd.endpoint(1), etcd.endpoint(2));
    config_b.id_epoch = "2025-01-01T00:00:05Z".into();
    let a = Lease::start(&config_a, Registration::default())
        .await
        .expect("start A");
    let zombie = a.identity();
    assert_eq!(zombie.state().machine_id.map(|m| m.get()), Some(SLOT));
    let mut ids_a: Vec<u64> = zombie.mint_many(100).expect("A mints").0;

    etcd.kill(0);
    let cut = Instant::now();
    // A's lease ends on the other two members (revoked here, as if it had
    // expired, so B claims while A's reservation still runs); B takes the slot.
    let lease_a = zombie.state().lease_id.expect("A's lease");
    while c.lease_revoke(lease_a).await.is_err() {
        assert!(
            cut.elapsed() < Duration::from_secs(30),
            "cannot revoke A's lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = loop {
        match Lease::start(&config_b, Registration::default()).await {
            Ok(b) => break b,
            // Every slot taken (A's lease lives on) or no answer yet (e0
            // may have led the cluster): try again.
            Err(LeaseError::SlotsExhausted { .. } | LeaseError::Etcd(_)) => {
                if let Ok((more, _)) = zombie.mint_many(50) {
                    ids_a.extend(more);
                }
                assert!(
                    cut.elapsed() < Duration::from_secs(30),
                    "A's lease never expired"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("B: {e}"),
        }
    };
    assert_eq!(b.identity().state().machine_id.map(|m| m.get()), Some(SLOT));
    let mut ids_b = Vec::new();
    // Both mint until A's reservation is used up.
    let stopped = loop {
        match zombie.mint_many(50) {
            Ok((more, _)) => ids_a.extend(more),
            Err(e) => break e,
        }
        ids_b.extend(b.identity().mint_many(50).expect("B mints").0);
        assert!(cut.elapsed() < Duration::from_secs(60), "A minted forever");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(stopped.0.contains("floor reserved"), "{}", stopped.0);
    assert!(!ids_b.is_empty(), "B minted while A still did");
    eprintln!(
        "A minted {} IDs, {:.1} s past the cut; B {} meanwhile",
        ids_a.len(),
        cut.elapsed().as_secs_f64(),
        ids_b.len()
    );

    // The spare slot frees; e0 returns: A learns its lease is gone and
    // claims the spare slot, minting again without a restart.
    // The test's own client balances over all three members, e0 included,
    // which is down: a call that lands on it is refused, so try again (the
    // balancer takes the next member).
    let mut freed = c.lease_revoke(spare).await;
    for _ in 0..20 {
        if freed.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        freed = c.lease_revoke(spare).await;
    }
    freed.expect("free the spare slot");
    etcd.restart(0);
    assert!(
        poll_until_blocking(Duration::from_secs(30), || zombie.mint_many(1).is_ok()),
        "A mints again after etcd returns: {:?}",
        zombie.state()
    );
    assert_eq!(zombie.state().machine_id.map(|m| m.get()), Some(SPARE));
    assert!(a.recoveries().get() >= 1);
    ids_a.extend(zombie.mint_many(100).expect("A mints").0);
    ids_b.extend(b.identity().mint_many(100).expect("B mints").0);

    let mut all: HashSet<u64> = HashSet::new();
    for id in ids_a.iter().chain(&ids_b) {
        assert!(all.insert(*id), "{id} repeated");
    }
    a.shutdown().await;
    b.shutdown().await;
}
