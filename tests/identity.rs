//! The identity against a real etcd (contract 5): the slot claim order, slot
//! exhaustion, concurrent workers, fencing on lease loss and recovery, and
//! the revoke on shutdown.

mod common;

use common::Etcd;
use etcd_client::{Client, GetOptions, PutOptions, Txn, TxnOp};
use prefill_handoff::config::{Config, EtcdConfig};
use prefill_handoff::identity::registry::probe_order;
use prefill_handoff::identity::{Identity, IdentityState, Lease, LeaseError, Registration};
use prefill_handoff::ids::{IdLayout, MachineId};
use std::future::Future;
use std::time::Duration;

const TTL: u64 = 3;
const WAIT: Duration = Duration::from_secs(30);

fn config(etcd: &Etcd, ttl: u64) -> Config {
    // Transitions are logged; `--no-capture` shows them.
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("prefill_handoff=debug")
        .try_init();
    Config {
        etcd: EtcdConfig {
            endpoints: etcd.endpoint(),
            ..EtcdConfig::default()
        },
        lease_ttl_secs: ttl,
        ..Config::default()
    }
    .resolve()
    .expect("test config resolves")
}

fn registration() -> Registration {
    Registration {
        subjects: vec!["llm.prefill.results".into(), "llm.gen.jobs".into()],
    }
}

fn hex(lease: i64) -> String {
    format!("{:016x}", lease as u64)
}

fn slot_key(machine_id: u16) -> String {
    format!("/llm/handoff/machine-ids/{machine_id}")
}

async fn client(etcd: &Etcd) -> Client {
    Client::connect([etcd.endpoint()], None)
        .await
        .expect("test client connects to etcd")
}

/// Claims every slot except `free` under one new lease of the test's own;
/// returns that lease. Batched: etcd allows 128 operations per transaction.
async fn preclaim_all_except(client: &mut Client, free: &[u16]) -> i64 {
    let lease = client.lease_grant(120, None).await.expect("grant").id();
    let slots: Vec<u16> = (0..1021).filter(|m| !free.contains(m)).collect();
    for batch in slots.chunks(100) {
        let ops: Vec<TxnOp> = batch
            .iter()
            .map(|m| {
                TxnOp::put(
                    slot_key(*m),
                    hex(lease),
                    Some(PutOptions::new().with_lease(lease)),
                )
            })
            .collect();
        client
            .txn(Txn::new().and_then(ops))
            .await
            .expect("pre-claim txn");
    }
    lease
}

/// The key's attached lease and value, or `None` when it does not exist.
async fn get(client: &mut Client, key: &str) -> Option<(i64, String)> {
    let answer = client.get(key, None).await.expect("get");
    answer
        .kvs()
        .first()
        .map(|kv| (kv.lease(), String::from_utf8_lossy(kv.value()).into_owned()))
}

async fn count_prefix(client: &mut Client, prefix: &str) -> usize {
    client
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count")
        .count() as usize
}

/// Polls `check` every 20 ms until it holds or `timeout` passes.
async fn until<F: Future<Output = bool>>(timeout: Duration, mut check: impl FnMut() -> F) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn held(identity: &Identity) -> (i64, MachineId) {
    let IdentityState {
        lease_id,
        machine_id,
        fenced,
    } = identity.state();
    assert!(
        !fenced,
        "identity should hold a slot: {:?}",
        identity.state()
    );
    (
        lease_id.expect("a lease"),
        machine_id.expect("a machine id"),
    )
}

/// The machine ID the IDs minted now carry.
fn minted_machine_id(identity: &Identity) -> u16 {
    let (ids, machine_id) = identity.mint_many(3).expect("mint while holding a slot");
    for id in ids {
        let decoded = IdLayout::Rc22.decode(id).expect("decode a minted ID");
        assert_eq!(decoded.machine_id, machine_id.get());
    }
    machine_id.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_lease_mod_1021_when_free_and_registers_the_instance() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    let lease = Lease::start(&config(&etcd, TTL), registration())
        .await
        .expect("start");
    let identity = lease.identity();
    let (lease_id, machine_id) = held(&identity);

    assert_eq!(machine_id, MachineId::preferred_for_lease(lease_id));
    assert_eq!(
        machine_id.get() as i64,
        lease_id % 1021,
        "slot = lease % 1021"
    );
    let (slot_lease, slot_value) = get(&mut c, &slot_key(machine_id.get()))
        .await
        .expect("slot key exists");
    assert_eq!(
        slot_lease, lease_id,
        "the slot key is attached to the lease"
    );
    assert_eq!(slot_value, hex(lease_id));

    let instance_key = format!("/llm/handoff/instances/{}", hex(lease_id));
    let (instance_lease, record) = get(&mut c, &instance_key)
        .await
        .expect("instance key exists");
    assert_eq!(instance_lease, lease_id);
    let record: serde_json::Value = serde_json::from_str(&record).expect("instance JSON");
    assert_eq!(record["machine_id"], machine_id.get());
    assert_eq!(record["pid"], std::process::id());
    assert_eq!(record["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        record["subjects"],
        serde_json::json!(["llm.prefill.results", "llm.gen.jobs"])
    );
    assert!(record["host"].as_str().is_some_and(|h| !h.is_empty()));
    let started = record["started_at"].as_str().expect("started_at");
    assert!(
        started.ends_with('Z') && started.len() == 20,
        "RFC 3339 UTC: {started}"
    );

    assert_eq!(minted_machine_id(&identity), machine_id.get());
    lease.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_all_but_one_slot_taken_finds_the_last_one() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    preclaim_all_except(&mut c, &[517]).await;
    let lease = Lease::start(&config(&etcd, TTL), registration())
        .await
        .expect("start");
    let (lease_id, machine_id) = held(&lease.identity());
    assert_eq!(machine_id.get(), 517);
    assert_eq!(
        get(&mut c, &slot_key(517)).await.map(|s| s.0),
        Some(lease_id)
    );
    lease.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_preferred_slot_moves_the_claim_to_the_next_free_one_upward() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    // Leases from one etcd member are close to each other: free two slots
    // around where the worker's lease will prefer, so both the plain and the
    // wrapping case are likely, and the answer depends on the order.
    let probe = c.lease_grant(60, None).await.expect("grant").id();
    let near = MachineId::preferred_for_lease(probe).get();
    let free = [(near + 300) % 1021, (near + 700) % 1021];
    preclaim_all_except(&mut c, &free).await;

    let lease = Lease::start(&config(&etcd, TTL), registration())
        .await
        .expect("start");
    let (lease_id, machine_id) = held(&lease.identity());
    let expected = probe_order(lease_id)
        .find(|m| free.contains(&m.get()))
        .expect("one of the free slots");
    assert_eq!(
        machine_id,
        expected,
        "first free slot at or after {} in wrapping order",
        lease_id % 1021
    );
    let other = free.iter().find(|m| **m != machine_id.get()).copied();
    assert_eq!(
        get(&mut c, &slot_key(other.unwrap())).await,
        None,
        "only one slot is claimed"
    );
    lease.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_slot_taken_start_fails_clearly_and_leaves_nothing_behind() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    preclaim_all_except(&mut c, &[]).await;
    let err = match Lease::start(&config(&etcd, TTL), registration()).await {
        Ok(_) => panic!("no slot is free, start must fail"),
        Err(e) => e,
    };
    assert!(matches!(err, LeaseError::SlotsExhausted { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("all 1021 machine-ID slots")
            && message.contains("/llm/handoff/machine-ids/"),
        "{message}"
    );
    assert_eq!(count_prefix(&mut c, "/llm/handoff/instances/").await, 0);
    assert_eq!(
        count_prefix(&mut c, "/llm/handoff/machine-ids/").await,
        1021
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_started_together_hold_eight_distinct_slots() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    let config = config(&etcd, TTL);
    let leases: Vec<Lease> =
        futures::future::join_all((0..8).map(|_| Lease::start(&config, registration())))
            .await
            .into_iter()
            .map(|r| r.expect("start"))
            .collect();

    let mut slots = Vec::new();
    for lease in &leases {
        let (lease_id, machine_id) = held(&lease.identity());
        let slot = get(&mut c, &slot_key(machine_id.get())).await;
        assert_eq!(slot.map(|s| s.0), Some(lease_id), "slot held by its lease");
        let instance = get(&mut c, &format!("/llm/handoff/instances/{}", hex(lease_id)))
            .await
            .expect("each worker has its instance key");
        let record: serde_json::Value = serde_json::from_str(&instance.1).expect("JSON");
        assert_eq!(record["machine_id"], machine_id.get());
        slots.push(machine_id.get());
    }
    slots.sort();
    slots.dedup();
    assert_eq!(slots.len(), 8, "distinct slots: {slots:?}");
    assert_eq!(count_prefix(&mut c, "/llm/handoff/machine-ids/").await, 8);
    assert_eq!(count_prefix(&mut c, "/llm/handoff/instances/").await, 8);
    for lease in leases {
        lease.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_is_replaced_by_a_new_lease_and_slot() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    let lease = Lease::start(&config(&etcd, TTL), registration())
        .await
        .expect("start");
    let identity = lease.identity();
    let (old_lease, old_slot) = held(&identity);

    etcd.etcdctl(&["lease", "revoke", &hex(old_lease)])
        .expect("etcdctl lease revoke");
    let recovered = until(Duration::from_secs(TTL) + WAIT, || async {
        let s = identity.state();
        !s.fenced && s.lease_id.is_some_and(|l| l != old_lease)
    })
    .await;
    assert!(recovered, "no new lease and slot: {:?}", identity.state());
    assert_eq!(lease.recoveries().get(), 1);

    let (new_lease, new_slot) = held(&identity);
    assert_eq!(minted_machine_id(&identity), new_slot.get());
    assert_eq!(
        get(&mut c, &slot_key(new_slot.get())).await.map(|s| s.0),
        Some(new_lease)
    );
    if new_slot != old_slot {
        assert_eq!(get(&mut c, &slot_key(old_slot.get())).await, None);
    }
    assert_eq!(
        get(
            &mut c,
            &format!("/llm/handoff/instances/{}", hex(old_lease))
        )
        .await,
        None
    );
    assert!(
        get(
            &mut c,
            &format!("/llm/handoff/instances/{}", hex(new_lease))
        )
        .await
        .is_some()
    );
    lease.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_slot_key_fences_at_once_and_recovery_waits_for_a_free_slot() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    let lease = Lease::start(&config(&etcd, TTL), registration())
        .await
        .expect("start");
    let identity = lease.identity();
    let (old_lease, old_slot) = held(&identity);

    // Someone else takes every other slot, then overwrites ours: the worker
    // must stop minting and cannot get a slot until one frees.
    let intruder = preclaim_all_except(&mut c, &[old_slot.get()]).await;
    c.put(
        slot_key(old_slot.get()),
        hex(intruder),
        Some(PutOptions::new().with_lease(intruder)),
    )
    .await
    .expect("overwrite the slot");
    assert!(
        until(WAIT, || async { identity.is_fenced() }).await,
        "a rewritten slot key must fence"
    );
    assert!(identity.mint_many(1).is_err(), "fenced: minting refused");
    // Recovery keeps failing while every slot is taken: still fenced a
    // while later, and the old lease is gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(identity.is_fenced());
    assert!(identity.mint_many(1).is_err());
    assert_eq!(
        get(
            &mut c,
            &format!("/llm/handoff/instances/{}", hex(old_lease))
        )
        .await,
        None,
        "the old lease was revoked"
    );

    c.lease_revoke(intruder).await.expect("free every slot");
    let recovered = until(WAIT, || async { !identity.is_fenced() }).await;
    assert!(
        recovered,
        "recovers once slots free: {:?}",
        identity.state()
    );
    let (new_lease, new_slot) = held(&identity);
    assert_ne!(new_lease, old_lease);
    assert_eq!(minted_machine_id(&identity), new_slot.get());
    assert_eq!(lease.recoveries().get(), 1);
    lease.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_longer_than_the_ttl_fences_and_its_return_recovers() {
    let mut etcd = Etcd::start();
    let lease = Lease::start(&config(&etcd, 2), registration())
        .await
        .expect("start");
    let identity = lease.identity();
    let (old_lease, _) = held(&identity);

    etcd.kill();
    assert!(
        until(WAIT, || async { identity.is_fenced() }).await,
        "etcd gone for a TTL must fence"
    );
    let refused = identity.mint_many(1).expect_err("fenced: no ID");
    assert!(!refused.0.is_empty());
    // Down well past the TTL: still fenced, never minting on hope.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(identity.is_fenced());
    assert!(identity.mint_many(1).is_err());

    etcd.restart();
    let recovered = until(WAIT, || async {
        let s = identity.state();
        !s.fenced && s.lease_id.is_some_and(|l| l != old_lease)
    })
    .await;
    assert!(
        recovered,
        "recovers after etcd returns: {:?}",
        identity.state()
    );
    assert!(lease.recoveries().get() >= 1);
    let (new_lease, new_slot) = held(&identity);
    let mut c = client(&etcd).await;
    assert_eq!(
        get(&mut c, &slot_key(new_slot.get())).await.map(|s| s.0),
        Some(new_lease)
    );
    assert_eq!(minted_machine_id(&identity), new_slot.get());
    lease.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_revokes_so_slot_and_instance_keys_vanish_at_once() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    let lease = Lease::start(&config(&etcd, 10), registration())
        .await
        .expect("start");
    let identity = lease.identity();
    let (lease_id, machine_id) = held(&identity);
    assert!(get(&mut c, &slot_key(machine_id.get())).await.is_some());

    lease.shutdown().await;
    // No waiting: with a 10 s TTL only the revoke can have removed them.
    assert_eq!(get(&mut c, &slot_key(machine_id.get())).await, None);
    assert_eq!(
        get(&mut c, &format!("/llm/handoff/instances/{}", hex(lease_id))).await,
        None
    );
    assert!(identity.is_fenced(), "no minting after shutdown");
    assert!(identity.mint_many(1).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_etcd_dead_still_returns() {
    let mut etcd = Etcd::start();
    let lease = Lease::start(&config(&etcd, TTL), registration())
        .await
        .expect("start");
    let identity = lease.identity();
    etcd.kill();
    let returned = tokio::time::timeout(WAIT, lease.shutdown()).await;
    assert!(returned.is_ok(), "shutdown must not hang on a dead etcd");
    assert!(identity.is_fenced());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_without_etcd_fails_with_the_endpoint_in_the_message() {
    let etcd = Etcd::start();
    let mut config = config(&etcd, TTL);
    drop(etcd);
    config.etcd.connect_timeout_ms = 300;
    config.etcd.request_timeout_ms = 300;
    let err = match Lease::start(&config, registration()).await {
        Ok(_) => panic!("no etcd, start must fail"),
        Err(e) => e,
    };
    assert!(matches!(err, LeaseError::Etcd(_)), "{err:?}");
    assert!(err.to_string().contains(&config.etcd.endpoints), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_etcd_outage_keeps_the_slot_and_the_slot_watch_comes_back() {
    let mut etcd = Etcd::start();
    let lease = Lease::start(&config(&etcd, 10), registration())
        .await
        .expect("start");
    let identity = lease.identity();
    let (lease_id, machine_id) = held(&identity);

    // Back well within the 10 s TTL: the same lease and slot, never fenced.
    etcd.restart();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(held(&identity), (lease_id, machine_id));
    assert_eq!(lease.recoveries().get(), 0);
    assert_eq!(minted_machine_id(&identity), machine_id.get());

    // The keepalive still succeeds, so only the (re-opened) slot watch can
    // notice that someone rewrote the slot key during or after the outage.
    let mut c = client(&etcd).await;
    let intruder = c.lease_grant(60, None).await.expect("grant").id();
    c.put(
        slot_key(machine_id.get()),
        hex(intruder),
        Some(PutOptions::new().with_lease(intruder)),
    )
    .await
    .expect("overwrite the slot");
    assert!(
        until(WAIT, || async {
            identity.state().lease_id != Some(lease_id) || identity.is_fenced()
        })
        .await,
        "a rewritten slot key must end the old slot"
    );
    let recovered = until(WAIT, || async { !identity.is_fenced() }).await;
    assert!(recovered, "{:?}", identity.state());
    let (new_lease, new_slot) = held(&identity);
    assert_ne!(new_lease, lease_id);
    assert_ne!(
        new_slot, machine_id,
        "the rewritten slot belongs to the intruder"
    );
    lease.shutdown().await;
}
