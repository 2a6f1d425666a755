//! Claiming a slot: `lease_id % 1021` first, then upward; exhaustion; many
//! workers at once; the revoke on shutdown.

use super::support::*;
use crate::common::{Etcd, poll_until};
use prefill_handoff::identity::registry::probe_order;
use prefill_handoff::identity::{Lease, LeaseError};
use prefill_handoff::ids::MachineId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_lease_mod_1021_when_free_and_registers_the_instance() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    let lease = start_lease(&etcd, TTL).await;
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
    let lease = start_lease(&etcd, TTL).await;
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

    let lease = start_lease(&etcd, TTL).await;
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
async fn shutdown_revokes_so_slot_and_instance_keys_vanish_at_once() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    let lease = start_lease(&etcd, 10).await;
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
async fn authenticates_with_etcd_user_and_password() {
    let etcd = Etcd::start();
    etcd.etcdctl(&["user", "add", "root:s3cret"])
        .expect("add root user");
    etcd.etcdctl(&["auth", "enable"]).expect("enable auth");

    let mut config = config(&etcd, TTL);
    let err = match Lease::start(&config, registration()).await {
        Ok(_) => panic!("auth is on; no credentials must fail"),
        Err(e) => e,
    };
    assert!(matches!(err, LeaseError::Etcd(_)), "{err:?}");

    // A user without a password is refused when the configuration is
    // loaded (tests/offline/config/errors.rs), never at the claim.
    config.etcd.user = Some("root".into());
    config.etcd.password = Some("s3cret".into());
    let lease = Lease::start(&config, registration())
        .await
        .expect("start with credentials");
    let (_, machine_id) = held(&lease.identity());
    assert_eq!(minted_machine_id(&lease.identity()), machine_id.get());
    lease.shutdown().await;
}

/// A claim whose first ID-floor write fails may not keep its slot: the lease
/// is revoked at once (no slot, instance key or lease is left behind, nor
/// piles up over the retries) and recovery retries until the write succeeds.
/// Here the write fails because the worker's etcd user may take slots but
/// not write ID floors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_first_floor_write_fails_revokes_its_lease_and_retries() {
    let etcd = Etcd::start();
    let as_root = |args: &[&str]| -> String {
        let mut all = vec!["--user", "root:s3cret"];
        all.extend_from_slice(args);
        etcd.etcdctl(&all)
            .unwrap_or_else(|| panic!("etcdctl {args:?} failed"))
    };
    for args in [
        &["user", "add", "root:s3cret"][..],
        &["role", "add", "worker"],
        &["user", "add", "worker:pw"],
        &["user", "grant-role", "worker", "worker"],
        &[
            "role",
            "grant-permission",
            "worker",
            "readwrite",
            "--prefix=true",
            "/llm/handoff/",
        ],
        &["auth", "enable"],
    ] {
        etcd.etcdctl(args)
            .or_else(|| Some(as_root(args)))
            .expect("auth setup");
    }
    let leases = || -> Vec<String> {
        as_root(&["lease", "list"])
            .lines()
            .skip(1)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut config = config(&etcd, 10);
    config.etcd.user = Some("worker".into());
    config.etcd.password = Some("pw".into());
    let lease = Lease::start(&config, registration())
        .await
        .expect("start with full rights");
    let identity = lease.identity();
    let (old_lease, _) = held(&identity);

    // From now on floors are read-only for the worker; its lease ends.
    as_root(&[
        "role",
        "revoke-permission",
        "worker",
        "/llm/handoff/",
        "--prefix=true",
    ]);
    for prefix in ["/llm/handoff/machine-ids/", "/llm/handoff/instances/"] {
        as_root(&[
            "role",
            "grant-permission",
            "worker",
            "readwrite",
            "--prefix=true",
            prefix,
        ]);
    }
    as_root(&[
        "role",
        "grant-permission",
        "worker",
        "read",
        "--prefix=true",
        "/llm/handoff/id-floors/",
    ]);
    as_root(&["lease", "revoke", &hex(old_lease)]);
    assert!(
        poll_until(WAIT, || async { identity.is_fenced() }).await,
        "the revoked lease fences"
    );
    // Claims keep failing at the floor write, with backoff up to 5 s. Each
    // failed attempt's lease (TTL 10 s) must be revoked, not left to expire.
    let watched = std::time::Instant::now();
    let mut most = 0;
    while watched.elapsed() < std::time::Duration::from_secs(6) {
        let live = leases();
        most = most.max(live.len());
        let keys = as_root(&[
            "get",
            "--prefix",
            "/llm/handoff/machine-ids/",
            "--keys-only",
        ]);
        let slots = keys.lines().filter(|l| !l.is_empty()).count();
        assert!(slots <= 1, "slots left behind by failed claims: {keys}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(most <= 1, "leases of failed claims pile up: {most} at once");
    assert!(identity.is_fenced(), "no slot without a floor written");
    assert!(identity.mint_many(1).is_err());
    assert_eq!(lease.recoveries().get(), 0);

    as_root(&[
        "role",
        "grant-permission",
        "worker",
        "readwrite",
        "--prefix=true",
        "/llm/handoff/id-floors/",
    ]);
    assert!(
        poll_until(WAIT, || async { !identity.is_fenced() }).await,
        "recovery retries and succeeds once the floor can be written"
    );
    assert_eq!(lease.recoveries().get(), 1);
    let (new_lease, _) = held(&identity);
    assert_eq!(
        leases(),
        vec![hex(new_lease)],
        "only the holder's lease lives"
    );
    lease.shutdown().await;
}
