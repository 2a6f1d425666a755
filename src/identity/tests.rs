//! The identity's minting rules with the time passed in: the process's own
//! high water across installs, and the reservation from the slot's ID floor.

use super::{Identity, Reservation};
use crate::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout, MachineId};
use std::collections::HashSet;
use std::time::{Duration, Instant};

const LAYOUTS: [IdLayout; 2] = [IdLayout::Rc21, IdLayout::Rc22];

fn slot(n: i128) -> MachineId {
    MachineId::new(n).expect("a valid machine ID")
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

fn ms(layout: IdLayout, id: u64) -> u64 {
    layout.decode(id).expect("a minted ID decodes").timestamp_ms
}

fn per_ms(layout: IdLayout) -> usize {
    usize::from(layout.max_counter()) + 1
}

#[test]
fn a_reinstalled_slot_starts_above_the_last_millisecond_even_when_the_clock_reads_lower() {
    for layout in LAYOUTS {
        let identity = Identity::new(layout, DEFAULT_EPOCH_UNIX_MS);
        identity.install(1, slot(9), Some(later()));
        let (first, _) = identity.mint_many_at(5, || 5000).expect("mint");
        assert_eq!(identity.high_water_ms(), Some(5000));
        identity.fence();
        assert_eq!(identity.high_water_ms(), Some(5000), "{layout}: kept");

        // Fenced, re-claimed the same slot; meanwhile the clock stepped back.
        identity.install(2, slot(9), Some(later()));
        let (second, machine_id) = identity.mint_many_at(5, || 4000).expect("mint");
        assert_eq!(machine_id, slot(9));
        let seen: HashSet<u64> = first.iter().copied().collect();
        for id in &second {
            assert!(
                !seen.contains(id),
                "{layout}: {id} repeated after re-install"
            );
            assert!(ms(layout, *id) > 5000, "{layout}: {id} not above 5000");
        }
        assert_eq!(ms(layout, second[0]), 5001, "{layout}: right above");
        assert!(second.windows(2).all(|w| w[0] < w[1]));
    }
}

#[test]
fn a_reinstall_with_the_clock_ahead_follows_the_clock() {
    let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    identity.install(1, slot(3), Some(later()));
    identity.mint_many_at(1, || 100).expect("mint");
    identity.fence();
    identity.install(2, slot(3), Some(later()));
    let (ids, _) = identity.mint_many_at(1, || 900).expect("mint");
    assert_eq!(ms(IdLayout::Rc22, ids[0]), 900);
}

#[test]
fn a_reserved_slot_starts_above_the_previous_floor_and_borrows_up_to_the_reservation() {
    for layout in LAYOUTS {
        let identity = Identity::new(layout, DEFAULT_EPOCH_UNIX_MS);
        let reservation = Reservation {
            above_ms: Some(10_000),
            until_ms: 10_003,
        };
        identity.install_reserved(1, slot(700), later(), reservation);
        // The clock is far behind the floor the previous holder left: the
        // generator mints from 10_001 on, borrowing milliseconds as each
        // counter is used up, up to 10_003 and no further.
        let clock = || 42;
        let (ids, _) = identity
            .mint_many_at(3 * per_ms(layout), clock)
            .expect("three milliseconds fit the reservation");
        assert_eq!(ms(layout, ids[0]), 10_001, "{layout}");
        assert_eq!(ms(layout, *ids.last().expect("some")), 10_003, "{layout}");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{layout}: increasing");

        let err = identity
            .mint_many_at(1, clock)
            .expect_err("beyond the reservation");
        assert!(err.0.contains("floor reserved in etcd"), "{}", err.0);

        // A renewal makes room again; minting continues where it stopped.
        identity.reserve(10_010);
        let (more, _) = identity.mint_many_at(1, clock).expect("renewed");
        assert_eq!(ms(layout, more[0]), 10_004, "{layout}");
    }
}

#[test]
fn a_clock_past_the_reservation_refuses_to_mint() {
    let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    let reservation = Reservation {
        above_ms: None,
        until_ms: 2_000,
    };
    identity.install_reserved(1, slot(1), later(), reservation);
    let (ids, _) = identity.mint_many_at(1, || 2_000).expect("at the edge");
    assert_eq!(ms(IdLayout::Rc22, ids[0]), 2_000);
    let err = identity.mint_many_at(1, || 2_001).expect_err("past it");
    assert!(
        err.0.contains("2001 ms") && err.0.contains("2000 ms"),
        "{}",
        err.0
    );
    assert!(
        !identity.is_fenced(),
        "a spent reservation is not a lost slot"
    );
}

#[test]
fn a_reservation_only_grows_and_renewals_cover_the_last_minted_millisecond() {
    let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    assert_eq!(
        identity.renewal_floor(1_000),
        None,
        "nothing to renew while fenced"
    );
    // The clock reads ~now since the epoch; a floor far ahead of it must
    // still be covered by the renewal.
    let ahead = identity.now_ms() + 3_600_000;
    let reservation = Reservation {
        above_ms: Some(ahead),
        until_ms: ahead + 500,
    };
    identity.install_reserved(1, slot(2), later(), reservation);
    let (ids, _) = identity.mint_many(1).expect("mint above the floor");
    assert_eq!(ms(IdLayout::Rc22, ids[0]), ahead + 1);
    assert_eq!(identity.renewal_floor(1_000), Some(ahead + 1 + 1_000));
    // A shorter window would shrink it below what is held: it does not.
    assert_eq!(identity.renewal_floor(10), Some(ahead + 500));
    identity.reserve(ahead + 100);
    assert_eq!(identity.lock().reserved_until_ms, Some(ahead + 500));
    identity.fence();
    assert_eq!(identity.renewal_floor(1_000), None);
    assert_eq!(identity.high_water_ms(), Some(ahead + 1));
}

#[test]
fn fixed_identities_have_no_floor() {
    let identity = Identity::fixed(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS, slot(4));
    let (ids, _) = identity.mint_many_at(2, || 7).expect("mint");
    assert_eq!(ms(IdLayout::Rc22, ids[1]), 7);
    assert!(identity.mint_many_at(1, || u64::from(u32::MAX)).is_ok());
}

/// The lease cannot be confirmed (its validity as of the last keepalive ran
/// out, as during an etcd leader election): minting goes on within the
/// reservation, and stops when the real clock passes its end.
#[test]
fn an_unconfirmed_lease_mints_until_the_reservation_ends_by_the_real_clock() {
    let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    let now_ms = identity.now_ms();
    let reservation = Reservation {
        above_ms: None,
        until_ms: now_ms + 300,
    };
    // Valid until a moment ago: the last keepalive proves nothing any more.
    identity.install_reserved(1, slot(5), Instant::now(), reservation);
    std::thread::sleep(Duration::from_millis(5));
    let (ids, machine_id) = identity
        .mint_many(10)
        .expect("an unconfirmed lease still mints within the reservation");
    assert_eq!(machine_id, slot(5));
    assert!(!identity.is_fenced());

    // Keep minting until the deadline really passes.
    let mut last = *ids.last().expect("some");
    let started = Instant::now();
    let refused = loop {
        match identity.mint_many(1) {
            Ok((more, _)) => {
                assert!(more[0] > last, "IDs increase");
                assert!(ms(IdLayout::Rc22, more[0]) <= now_ms + 300, "within it");
                last = more[0];
            }
            Err(e) => break e,
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "minting never stopped"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(
        identity.now_ms() > now_ms + 300,
        "refused only past the end"
    );
    assert!(
        refused.0.contains("floor reserved in etcd"),
        "{}",
        refused.0
    );
    // A renewal written meanwhile makes room again, without a new claim.
    identity.reserve(identity.now_ms() + 1_000);
    assert!(identity.mint_many(1).is_ok(), "renewed: minting resumes");
}

/// Without a reservation (no etcd floor), the lease's validity still gates.
#[test]
fn without_a_reservation_an_expired_lease_fences() {
    let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
    identity.install(1, slot(6), Some(Instant::now()));
    std::thread::sleep(Duration::from_millis(2));
    assert!(identity.mint_many(1).is_err());
    assert!(identity.is_fenced());
}
