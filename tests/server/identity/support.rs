//! Helpers shared by the identity tests: a config pointing at the harness's
//! etcd, an etcd client for the test's own reads and writes, and waiting.

use crate::common::Etcd;
use etcd_client::{Client, GetOptions, PutOptions, Txn, TxnOp};
use prefill_handoff::config::{Config, EtcdConfig};
use prefill_handoff::identity::{Identity, IdentityState, Lease, Registration};
use prefill_handoff::ids::{IdLayout, MachineId};
use std::time::Duration;

pub const TTL: u64 = 3;
pub const WAIT: Duration = Duration::from_secs(30);

pub fn config(etcd: &Etcd, ttl: u64) -> Config {
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

/// A lease on `etcd` with a `ttl`-second TTL and the test registration,
/// started: the claim every test begins with.
pub async fn start_lease(etcd: &Etcd, ttl: u64) -> Lease {
    Lease::start(&config(etcd, ttl), registration())
        .await
        .expect("start")
}

pub fn registration() -> Registration {
    Registration {
        subjects: vec!["llm.prefill.results".into(), "llm.gen.jobs".into()],
    }
}

pub fn hex(lease: i64) -> String {
    format!("{:016x}", lease as u64)
}

/// The slot's ID floor: the millisecond its IDs are reserved up to.
pub fn floor_key(machine_id: u16) -> String {
    format!("/llm/handoff/id-floors/{machine_id}")
}

/// The slot's ID floor read from etcd (a fresh client, so it works across
/// restarts); `None` while etcd does not answer or holds none.
pub async fn floor_ms(etcd: &Etcd, machine_id: u16) -> Option<u64> {
    let mut client = Client::connect([etcd.endpoint()], None).await.ok()?;
    let answer = client.get(floor_key(machine_id), None).await.ok()?;
    let value = answer.kvs().first()?.value_str().ok()?;
    value.parse().ok()
}

pub fn slot_key(machine_id: u16) -> String {
    format!("/llm/handoff/machine-ids/{machine_id}")
}

pub async fn client(etcd: &Etcd) -> Client {
    Client::connect([etcd.endpoint()], None)
        .await
        .expect("test client connects to etcd")
}

/// Claims every slot except `free` under one new lease of the test's own;
/// returns that lease. Batched: etcd allows 128 operations per transaction.
pub async fn preclaim_all_except(client: &mut Client, free: &[u16]) -> i64 {
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
pub async fn get(client: &mut Client, key: &str) -> Option<(i64, String)> {
    let answer = client.get(key, None).await.expect("get");
    answer
        .kvs()
        .first()
        .map(|kv| (kv.lease(), String::from_utf8_lossy(kv.value()).into_owned()))
}

pub async fn count_prefix(client: &mut Client, prefix: &str) -> usize {
    client
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count")
        .count() as usize
}

pub fn held(identity: &Identity) -> (i64, MachineId) {
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
pub fn minted_machine_id(identity: &Identity) -> u16 {
    let (ids, machine_id) = identity.mint_many(3).expect("mint while holding a slot");
    for id in ids {
        let decoded = IdLayout::Rc22.decode(id).expect("decode a minted ID");
        assert_eq!(decoded.machine_id, machine_id.get());
    }
    machine_id.get()
}
