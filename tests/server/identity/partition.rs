//! etcd behind a link that goes silent without closing (issue 40), longer
//! than the lease TTL: etcd lets the lease expire while the worker hears
//! nothing. The worker must stop minting once its reservation is used up
//! (fenced, never minting on hope), and when the link heals take a new
//! lease and a slot without a restart, no ID ever minted twice, though
//! another worker took its old slot meanwhile.

use super::support::*;
use crate::common::fault_proxy::{Fault, FaultProxy};
use crate::common::{Etcd, poll_until};
use prefill_handoff::config::{Config, EtcdConfig};
use prefill_handoff::identity::{Identity, Lease};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

/// A lease reaching `etcd` through a fault proxy.
async fn lease_through(proxy: &FaultProxy, ttl: u64) -> Lease {
    let config = Config {
        etcd: EtcdConfig {
            endpoints: format!("http://{}", proxy.addr()),
            ..EtcdConfig::default()
        },
        lease_ttl_secs: ttl,
        ..Config::default()
    }
    .resolve()
    .expect("test config resolves");
    Lease::start(&config, registration()).await.expect("start")
}

/// Mints one ID at a time into `minted` until minting is refused; panics on
/// a repeated ID or when it never stops within `WAIT`.
async fn mint_until_refused(identity: &Identity, minted: &mut HashSet<u64>) -> usize {
    let start = std::time::Instant::now();
    let mut count = 0;
    while let Ok((ids, _)) = identity.mint_many(1) {
        assert!(minted.insert(ids[0]), "{} minted twice", ids[0]);
        count += 1;
        assert!(start.elapsed() < WAIT, "minting never stopped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    count
}

fn mint(identity: &Identity, n: usize, minted: &mut HashSet<u64>) {
    for _ in 0..n {
        let (ids, _) = identity.mint_many(1).expect("mint while holding a slot");
        assert!(minted.insert(ids[0]), "{} minted twice", ids[0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_black_holed_past_the_ttl_fences_then_a_new_lease_and_slot_mint_no_id_twice() {
    let etcd = Etcd::start();
    let upstream: SocketAddr = etcd
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .expect("etcd listens on an address");
    let proxy = FaultProxy::start(upstream);
    let lease = lease_through(&proxy, 2).await;
    let identity = lease.identity();
    let (old_lease, old_slot) = held(&identity);
    let mut minted = HashSet::new();
    mint(&identity, 100, &mut minted);

    proxy.set(Fault::BlackHole);
    let minted_in_cut = mint_until_refused(&identity, &mut minted).await;
    eprintln!("minted {minted_in_cut} IDs into the cut before refusing");
    // And it says so (the `fenced` gauge, readiness), past the TTL at most.
    let fenced = poll_until(WAIT, || async { identity.is_fenced() }).await;
    assert!(
        fenced,
        "refusing to mint but not fenced: {:?}",
        identity.state()
    );

    // etcd expires the lease meanwhile (the worker cannot tell it so), and
    // another worker, on a link that works, takes the freed slot: every
    // other slot is taken while it claims.
    let mut c = client(&etcd).await;
    let expired = poll_until(WAIT, || {
        let mut c = c.clone();
        async move { get(&mut c, &slot_key(old_slot.get())).await.is_none() }
    })
    .await;
    assert!(expired, "etcd never expired the cut-off lease");
    let others = preclaim_all_except(&mut c, &[old_slot.get()]).await;
    let second = start_lease(&etcd, 10).await;
    let second_identity = second.identity();
    let (_, second_slot) = held(&second_identity);
    assert_eq!(second_slot, old_slot, "the successor holds the old slot");
    mint(&second_identity, 200, &mut minted);
    c.lease_revoke(others).await.expect("free the other slots");
    // Still refused, well past the TTL: never minting on hope.
    assert!(identity.mint_many(1).is_err(), "{:?}", identity.state());

    proxy.set(Fault::Pass);
    let recovered = poll_until(WAIT, || async {
        let s = identity.state();
        !s.fenced && s.lease_id.is_some_and(|l| l != old_lease)
    })
    .await;
    assert!(recovered, "no new lease and slot: {:?}", identity.state());
    let (new_lease, new_slot) = held(&identity);
    assert_ne!(new_slot, second_slot, "two holders of one slot");
    assert_eq!(
        get(&mut c, &slot_key(new_slot.get())).await.map(|s| s.0),
        Some(new_lease),
        "the slot minted with is held in etcd"
    );
    assert_eq!(lease.recoveries().get(), 1);
    mint(&identity, 200, &mut minted);
    mint(&second_identity, 200, &mut minted);
    assert_eq!(minted_machine_id(&identity), new_slot.get());

    second.shutdown().await;
    lease.shutdown().await;
}
