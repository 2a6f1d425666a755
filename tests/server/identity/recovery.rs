//! Losing the slot and getting a new one: a revoked lease, a rewritten slot
//! key, etcd down past the TTL, a short etcd outage; shutdown on a dead etcd.

use super::support::*;
use crate::common::{Etcd, poll_until};
use etcd_client::PutOptions;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_is_replaced_by_a_new_lease_and_slot() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    let lease = start_lease(&etcd, TTL).await;
    let identity = lease.identity();
    let (old_lease, old_slot) = held(&identity);

    etcd.etcdctl(&["lease", "revoke", &hex(old_lease)])
        .expect("etcdctl lease revoke");
    let recovered = poll_until(Duration::from_secs(TTL) + WAIT, || async {
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
    let lease = start_lease(&etcd, TTL).await;
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
        poll_until(WAIT, || async { identity.is_fenced() }).await,
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
    let recovered = poll_until(WAIT, || async { !identity.is_fenced() }).await;
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

/// etcd gone for longer than the reservation (one TTL ahead of the last
/// renewal): minting goes on until the reservation is used up, and only then
/// is refused; when etcd returns, minting resumes without a restart, never
/// repeating an ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_longer_than_the_reservation_refuses_only_past_it_and_resumes_when_etcd_returns()
{
    let mut etcd = Etcd::start();
    let lease = start_lease(&etcd, 2).await;
    let identity = lease.identity();
    let mut minted = std::collections::HashSet::new();

    etcd.kill();
    let killed = std::time::Instant::now();
    let mut minted_while_down = 0;
    let refused = loop {
        match identity.mint_many(1) {
            Ok((ids, _)) => {
                minted_while_down += 1;
                assert!(minted.insert(ids[0]), "{} repeated", ids[0]);
            }
            Err(e) => break e,
        }
        assert!(killed.elapsed() < WAIT, "minting never stopped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(minted_while_down > 0, "etcd down: minting went on");
    assert_eq!(
        identity.reserved_for_ms(),
        Some(0),
        "refused only once the reservation is used up: {}",
        refused.0
    );
    eprintln!(
        "minted {minted_while_down} IDs for {:?} after etcd died",
        killed.elapsed()
    );
    // Down well past the TTL: still refused, never minting on hope.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(identity.mint_many(1).is_err());

    etcd.restart();
    let resumed = poll_until(WAIT, || async { identity.mint_many(1).is_ok() }).await;
    assert!(resumed, "minting resumes: {:?}", identity.state());
    for _ in 0..100 {
        let (ids, _) = identity.mint_many(1).expect("mint after etcd returned");
        assert!(
            minted.insert(ids[0]),
            "{} repeated across the outage",
            ids[0]
        );
    }
    let (lease_id, slot) = held(&identity);
    let mut c = client(&etcd).await;
    assert_eq!(
        get(&mut c, &slot_key(slot.get())).await.map(|s| s.0),
        Some(lease_id),
        "the slot minted with is held in etcd"
    );
    assert_eq!(minted_machine_id(&identity), slot.get());
    lease.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_etcd_dead_still_returns() {
    let mut etcd = Etcd::start();
    let lease = start_lease(&etcd, TTL).await;
    let identity = lease.identity();
    etcd.kill();
    let returned = tokio::time::timeout(WAIT, lease.shutdown()).await;
    assert!(returned.is_ok(), "shutdown must not hang on a dead etcd");
    assert!(identity.is_fenced());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_etcd_outage_keeps_the_slot_and_the_slot_watch_comes_back() {
    let mut etcd = Etcd::start();
    let lease = start_lease(&etcd, 10).await;
    let identity = lease.identity();
    let (lease_id, machine_id) = held(&identity);

    // Back well within the 10 s TTL: the same lease and slot, never fenced.
    // Waits for a keepalive round against the restarted etcd (the floor
    // renewal runs with each round; the slot watch is reopened right after
    // the round's keepalive), not for a fixed time.
    let before = floor_ms(&etcd, machine_id.get()).await.expect("a floor");
    etcd.restart();
    let renewed = poll_until(WAIT, || async {
        floor_ms(&etcd, machine_id.get())
            .await
            .is_some_and(|ms| ms > before)
    })
    .await;
    assert!(renewed, "a keepalive round reaches the restarted etcd");
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
        poll_until(WAIT, || async {
            identity.state().lease_id != Some(lease_id) || identity.is_fenced()
        })
        .await,
        "a rewritten slot key must end the old slot"
    );
    let recovered = poll_until(WAIT, || async { !identity.is_fenced() }).await;
    assert!(recovered, "{:?}", identity.state());
    let (new_lease, new_slot) = held(&identity);
    assert_ne!(new_lease, lease_id);
    assert_ne!(
        new_slot, machine_id,
        "the rewritten slot belongs to the intruder"
    );
    lease.shutdown().await;
}
