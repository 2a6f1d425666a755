//! IDs never repeat across successive holders of one slot (contract 6), even
//! when the next holder's clock is behind: the slot's ID floor in etcd.
//!
//! A clock that is behind is simulated with a later `id_epoch`: a worker whose
//! epoch is an hour later reads a `ts` an hour smaller, exactly like a clock
//! an hour behind. An hour, not seconds: the scenario (the next holder's clock
//! reads below the previous holder's last ID) then holds however slowly a
//! loaded machine gets from one holder to the next. The only free slot steers
//! both workers onto the same slot.

use super::support::*;
use crate::common::{Etcd, poll_until};
use prefill_handoff::clock;
use prefill_handoff::config::Config;
use prefill_handoff::identity::{Identity, Lease};
use prefill_handoff::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout};
use std::collections::HashSet;
use std::time::Duration;

const SLOT: u16 = 517;
/// How far behind the second holder's clock is.
const BEHIND_MS: u64 = 3_600_000;

/// `config` for a worker whose clock is `BEHIND_MS` behind.
fn behind(mut config: Config) -> Config {
    config.id_epoch = "2025-01-01T01:00:00Z".into();
    assert_eq!(
        config.epoch_unix_ms().expect("epoch"),
        DEFAULT_EPOCH_UNIX_MS + BEHIND_MS
    );
    config
}

fn ts(id: u64) -> u64 {
    IdLayout::Rc22
        .decode(id)
        .expect("a minted ID decodes")
        .timestamp_ms
}

/// Mints `rounds` batches of 300 IDs a couple of milliseconds apart, so they
/// span several milliseconds.
fn mint_rounds(identity: &Identity, rounds: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    for _ in 0..rounds {
        let (batch, machine_id) = identity
            .mint_many(300)
            .expect("mint while holding the slot");
        assert_eq!(machine_id.get(), SLOT);
        ids.extend(batch);
        std::thread::sleep(Duration::from_millis(2));
    }
    ids
}

/// Every ID of `next` lies above every ID of `previous` in time, and none
/// repeats.
fn assert_after(previous: &[u64], next: &[u64]) {
    let max_previous = previous.iter().map(|id| ts(*id)).max().expect("some IDs");
    let seen: HashSet<u64> = previous.iter().copied().collect();
    for id in next {
        assert!(!seen.contains(id), "ID {id} minted by both holders");
        assert!(
            ts(*id) > max_previous,
            "ID {id} has ts {} but the previous holder minted up to {max_previous}",
            ts(*id)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_graceful_stop_a_holder_whose_clock_is_behind_starts_right_above_the_last_id() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    let blockers = preclaim_all_except(&mut c, &[SLOT]).await;

    let a = Lease::start(&config(&etcd, TTL), registration())
        .await
        .expect("start A");
    assert_eq!(held(&a.identity()).1.get(), SLOT);
    let mut minted_a = mint_rounds(&a.identity(), 5);
    // Held past the first reservation: the keepalive rounds renew it, so
    // minting goes on. Waits for the clock to pass the reservation read
    // now, not for a fixed time.
    let (_, first) = get(&mut c, &floor_key(SLOT)).await.expect("a floor");
    let first: u64 = first.parse().expect("decimal ms");
    let past = poll_until(WAIT, || async {
        clock::since_epoch_ms(DEFAULT_EPOCH_UNIX_MS) > first
    })
    .await;
    assert!(past, "the clock passes the first reservation ({first})");
    minted_a.extend(mint_rounds(&a.identity(), 5));
    let max_a = minted_a.iter().map(|id| ts(*id)).max().expect("some IDs");
    let (floor_lease, reserved) = get(&mut c, &floor_key(SLOT)).await.expect("a floor");
    assert_eq!(floor_lease, 0, "the floor is not attached to a lease");
    assert!(
        reserved.parse::<u64>().expect("decimal ms") >= max_a,
        "the reservation {reserved} covers every ID minted (up to {max_a})"
    );

    a.shutdown().await;
    assert_eq!(
        get(&mut c, &floor_key(SLOT)).await,
        Some((0, max_a.to_string())),
        "after a graceful stop the floor is exactly the last minted millisecond"
    );
    assert_eq!(
        count_prefix(&mut c, "/llm/handoff/machine-ids/").await,
        1020,
        "the floor is no slot: only the pre-claimed slots are listed"
    );

    let b = Lease::start(&behind(config(&etcd, TTL)), registration())
        .await
        .expect("start B");
    assert_eq!(held(&b.identity()).1.get(), SLOT, "B holds A's slot");
    // The scenario is real: B's own clock reads below what A minted (by
    // about an hour less the time since A's last ID).
    assert!(clock::since_epoch_ms(DEFAULT_EPOCH_UNIX_MS + BEHIND_MS) < max_a);
    let minted_b = mint_rounds(&b.identity(), 10);
    assert_after(&minted_a, &minted_b);
    assert_eq!(
        ts(minted_b[0]),
        max_a + 1,
        "B starts right above A's last millisecond, not a TTL later"
    );
    assert!(minted_b.windows(2).all(|w| w[0] < w[1]), "B's IDs increase");
    b.shutdown().await;
    c.lease_revoke(blockers).await.expect("free the blockers");
}

/// A crashed holder writes nothing on the way out; a holder cut off from
/// etcd (a zombie) even keeps minting until its reservation ends, after the
/// next holder has claimed its slot. Neither may collide with the next holder.
#[test]
fn after_a_crash_and_a_lost_lease_a_holder_whose_clock_is_behind_starts_above_every_id_the_old_one_minted()
 {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    };
    let main = runtime();
    let etcd = Etcd::start();
    let mut c = main.block_on(client(&etcd));
    main.block_on(preclaim_all_except(&mut c, &[SLOT]));

    // A runs its etcd side on a runtime of its own, so the test can stop it
    // dead: no floor write, no revoke, as if the process were gone.
    let a_side = runtime();
    // A generous TTL: A, cut off, still mints well after B has claimed.
    let a = a_side
        .block_on(Lease::start(&config(&etcd, 10), registration()))
        .expect("start A");
    let zombie = a.identity();
    let (lease_a, slot) = held(&zombie);
    assert_eq!(slot.get(), SLOT);
    let mut minted_a = mint_rounds(&zombie, 5);
    // The runtime goes first, and whole: once `shutdown_timeout` returns,
    // its threads are gone and A's tasks dropped unpolled. Dropping `a`
    // asks its task to stop (fence, settle, revoke); a task still running
    // would see that and fence the zombie. With `shutdown_background` it
    // sometimes did, on a loaded machine.
    a_side.shutdown_timeout(Duration::from_secs(30));
    drop(a);

    // The lease ends (revoked here, as if it had expired) and B, whose clock
    // is behind, claims the slot at once.
    main.block_on(c.lease_revoke(lease_a))
        .expect("revoke A's lease");
    let b = main
        .block_on(Lease::start(&behind(config(&etcd, TTL)), registration()))
        .expect("start B");
    assert_eq!(held(&b.identity()).1.get(), SLOT, "B holds A's slot");

    // Both mint side by side, the zombie until its reservation (10 s past
    // its last floor write) is used up: it is never fenced by time now.
    let mut minted_b = Vec::new();
    let mut zombie_rounds = 0;
    let started = std::time::Instant::now();
    let stopped = loop {
        match zombie.mint_many(300) {
            Ok((batch, _)) => minted_a.extend(batch),
            Err(e) => break e,
        }
        zombie_rounds += 1;
        minted_b.extend(mint_rounds(&b.identity(), 1));
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the zombie never reached the end of its reservation"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        stopped.0.contains("floor reserved"),
        "the zombie stopped at its reservation's end: {}",
        stopped.0
    );
    eprintln!(
        "the zombie minted {} rounds for {:.1} s after B's claim",
        zombie_rounds,
        started.elapsed().as_secs_f64()
    );
    assert!(zombie_rounds > 0, "the zombie minted after B's claim");
    minted_b.extend(mint_rounds(&b.identity(), 3));
    assert_after(&minted_a, &minted_b);
    assert!(minted_b.windows(2).all(|w| w[0] < w[1]), "B's IDs increase");
    main.block_on(b.shutdown());
}

/// Every floor write requires the slot key to still be attached to the
/// writer's lease. Without that rule a former holder's late renewal (sent
/// before it noticed the loss) could move the floor the next holder reads,
/// or a lowered floor could let the next-but-one holder repeat IDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_holders_late_floor_write_is_refused_once_the_slot_moved() {
    use prefill_handoff::identity::write_floor_as;
    use prefill_handoff::ids::MachineId;
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    preclaim_all_except(&mut c, &[SLOT]).await;
    let config = config(&etcd, TTL);
    let a = Lease::start(&config, registration())
        .await
        .expect("start A");
    let (lease_a, slot) = held(&a.identity());
    assert_eq!(slot.get(), SLOT);
    let slot = MachineId::new(SLOT.into()).expect("slot");
    // While A holds the slot, its writes go through.
    write_floor_as(&config, lease_a, slot, 1)
        .await
        .expect("the holder writes its floor");
    assert_eq!(
        get(&mut c, &floor_key(SLOT)).await.map(|f| f.1).as_deref(),
        Some("1")
    );

    // A's lease ends (A stops first: left running, it notices the loss and
    // claims the free slot again itself, sometimes before B does, and B
    // then finds no slot); B claims the slot and writes its reservation.
    // A's late write below is sent with A's lease as it was.
    a.shutdown().await;
    // Its shutdown revokes the lease; should that have timed out, so does this.
    let _already_revoked = c.lease_revoke(lease_a).await;
    assert!(
        c.lease_time_to_live(lease_a, None)
            .await
            .is_ok_and(|ttl| ttl.ttl() < 0),
        "A's lease is gone"
    );
    let b = Lease::start(&config, registration())
        .await
        .expect("start B");
    let (lease_b, b_slot) = held(&b.identity());
    assert_eq!(b_slot.get(), SLOT);
    let b_floor = get(&mut c, &floor_key(SLOT)).await.expect("B's floor").1;

    // A's late write, lowering the floor, is refused and changes nothing.
    let refused = write_floor_as(&config, lease_a, slot, 0).await;
    let err = refused.expect_err("a former holder's write must be refused");
    assert!(err.to_string().contains("no longer held"), "{err}");
    assert_eq!(
        get(&mut c, &floor_key(SLOT)).await.map(|f| f.1),
        Some(b_floor),
        "the floor is B's"
    );
    assert_ne!(lease_a, lease_b);
    b.shutdown().await;
}
