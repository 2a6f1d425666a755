//! The identity on a 3-member etcd: a leader election under load is
//! invisible to clients, and a full fleet of 1021 identities claims every
//! slot at once.

mod common;
mod worker_support;

use common::cluster::EtcdCluster;
use common::{Nats, eventually};
use etcd_client::{Client, EventType};
use prefill_handoff::config::{Config, EtcdConfig};
use prefill_handoff::identity::{Lease, LeaseError, Registration};
use prefill_handoff::ids::IdLayout;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};
use worker_support::{Collector, GEN, InProcess, PREFILL, client, decode_output, msgpack};

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
    let finish = if i % 3 == 0 {
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
    let outputs = collector
        .wait_outputs(RESULTS, Duration::from_secs(60))
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
    assert!(repeated.is_empty(), "requests with other than one output: {repeated:?}");
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
    let mut config = identity_config(&etcd, "nats://127.0.0.1:4222", 120);
    // 1021 claims at once queue up at etcd: give each request time.
    config.etcd.request_timeout_ms = 20_000;
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
    let stopping = Instant::now();
    futures::future::join_all(leases.into_iter().map(Lease::shutdown)).await;
    assert!(
        eventually(Duration::from_secs(30), || slot_keys(&etcd) == 0),
        "every slot freed on shutdown"
    );
    eprintln!(
        "and freed them in {:.1} s",
        stopping.elapsed().as_secs_f64()
    );
}
