//! Request IDs (contract 6): both layouts bit for bit, the machine-ID range,
//! and a generator that never repeats an ID.

use prefill_handoff::clock;
use prefill_handoff::ids::{
    DEFAULT_EPOCH_UNIX_MS, DecodedId, Exhausted, IdGenerator, IdLayout, LayoutError, MachineId,
    SLOT_COUNT,
};
use proptest::prelude::*;
use std::collections::HashSet;

const MAX: u128 = (1 << 63) - 1;
const LAYOUTS: [IdLayout; 2] = [IdLayout::Rc21, IdLayout::Rc22];

fn mid(n: i128) -> MachineId {
    MachineId::new(n).expect("a machine ID in range")
}

/// The contract's formulas, written out independently of the crate, in the
/// same arithmetic a Python reference would use (unbounded integers: u128).
fn reference(layout: IdLayout, ts: u64, machine_id: u16, counter: u16) -> u64 {
    let (ts, m, c) = (u128::from(ts), u128::from(machine_id), u128::from(counter));
    let id = match layout {
        IdLayout::Rc21 => {
            let raw = (ts << 22) | (m << 12) | c;
            raw % (MAX - (1 << 42)) + (1 << 42)
        }
        IdLayout::Rc22 => {
            let (node, process) = (m / 64, m % 64);
            let raw = ((ts % (1 << 39)) << 24) | (node << 16) | (process << 10) | c;
            raw % (MAX - (1 << 40)) + (1 << 40)
        }
    };
    u64::try_from(id).expect("an ID below 2^63")
}

#[test]
// Binary literals are grouped by field (ts, machine or node/process, counter).
#[allow(clippy::unusual_byte_groupings)]
fn layouts_match_hand_computed_ids() {
    // (layout, ts, machine_id, counter, expected): expected computed by hand
    // (Python) from the contract's formulas.
    let cases: &[(IdLayout, u64, u16, u16, u64)] = &[
        (IdLayout::Rc21, 0, 0, 0, 4_398_046_511_104), // 2^42
        (IdLayout::Rc21, 1000, 5, 3, 4_402_240_835_587),
        (
            IdLayout::Rc21,
            31_536_000_000,
            1020,
            4095,
            132_275_968_994_693_119,
        ),
        (
            IdLayout::Rc21,
            31_536_000_000,
            17,
            0,
            132_275_968_990_580_736,
        ),
        // ts beyond 2^41: the raw value passes 2^63 and the modulo wraps it.
        (IdLayout::Rc21, (1 << 41) + 7, 3, 1, 8_796_122_394_626),
        (IdLayout::Rc22, 0, 0, 0, 1_099_511_627_776), // 2^40
        (IdLayout::Rc22, 1000, 5, 3, 1_116_288_848_899),
        (
            IdLayout::Rc22,
            31_536_000_000,
            1020,
            1023,
            529_087_383_288_673_279,
        ),
        (
            IdLayout::Rc22,
            31_536_000_000,
            17,
            0,
            529_087_383_287_645_184,
        ),
        // ts beyond 2^39: rc22 keeps only the low 39 bits.
        (IdLayout::Rc22, (1 << 39) + 7, 64, 1, 1_099_629_133_825),
    ];
    for &(layout, ts, m, counter, expected) in cases {
        let id = layout.encode(ts, mid(m.into()), counter);
        assert_eq!(id, expected, "{layout} ts={ts} m={m} counter={counter}");
        assert_eq!(
            reference(layout, ts, m, counter),
            expected,
            "the reference formula"
        );
    }
    // The same fields, bit by bit: 1000 << 22 | 5 << 12 | 3, plus 2^42.
    assert_eq!(
        IdLayout::Rc21.encode(1000, mid(5), 3) - (1 << 42),
        0b1111101000_0000000101_000000000011
    );
    // rc22: 1000 << 24 | 0 << 16 | 5 << 10 | 3, plus 2^40.
    assert_eq!(
        IdLayout::Rc22.encode(1000, mid(5), 3) - (1 << 40),
        0b1111101000_00000000_000101_0000000011
    );
}

#[test]
fn rc22_splits_the_machine_id_by_64_and_rc21_keeps_it() {
    assert_eq!(mid(1020).node_and_process(), (15, 60));
    assert_eq!(mid(63).node_and_process(), (0, 63));
    assert_eq!(mid(64).node_and_process(), (1, 0));

    let rc22 = IdLayout::Rc22.decode(IdLayout::Rc22.encode(42, mid(1020), 9));
    assert_eq!(
        rc22,
        Ok(DecodedId {
            timestamp_ms: 42,
            machine_id: 1020,
            node_id: Some(15),
            process_id: Some(60),
            counter: 9,
        })
    );
    let rc21 = IdLayout::Rc21.decode(IdLayout::Rc21.encode(42, mid(1020), 9));
    assert_eq!(
        rc21,
        Ok(DecodedId {
            timestamp_ms: 42,
            machine_id: 1020,
            node_id: None,
            process_id: None,
            counter: 9,
        })
    );
}

#[test]
fn machine_ids_outside_0_to_1020_are_refused() {
    for bad in [-1, 1021, 1022, 1023, 1024, i128::from(u16::MAX) + 1, -1021] {
        let err = MachineId::new(bad).expect_err("out of range");
        assert!(err.to_string().contains("[0, 1021)"), "{err}");
    }
    for good in [0, 1, 1020] {
        assert_eq!(mid(good).get(), good as u16);
    }
    assert_eq!(SLOT_COUNT, 1021);
    assert_eq!(mid(1020).next_wrapping(), mid(0));
    assert_eq!(MachineId::preferred_for_lease(1021 * 5 + 7), mid(7));
}

#[test]
fn decode_refuses_ids_no_layout_mints() {
    assert!(matches!(
        IdLayout::Rc21.decode((1 << 42) - 1),
        Err(LayoutError::BelowOffset { .. })
    ));
    assert!(matches!(
        IdLayout::Rc22.decode(5),
        Err(LayoutError::BelowOffset { .. })
    ));
    assert!(matches!(
        IdLayout::Rc22.decode(u64::MAX),
        Err(LayoutError::AboveMax { .. })
    ));
    // node 15, process 61 = machine ID 1021.
    let raw: u64 = (15 << 16) | (61 << 10);
    assert!(matches!(
        IdLayout::Rc22.decode(raw + (1 << 40)),
        Err(LayoutError::NotAMachineId {
            machine_id: 1021,
            ..
        })
    ));
    assert!(matches!(
        "rc23".parse::<IdLayout>(),
        Err(LayoutError::UnknownLayout(_))
    ));
    assert_eq!("rc21".parse::<IdLayout>(), Ok(IdLayout::Rc21));
}

proptest! {
    #[test]
    fn decode_of_mint_returns_the_fields_for_every_machine_id(
        ts21 in 0u64..(1 << 41),
        ts22 in 0u64..(1 << 39),
        c21 in 0u16..4096,
        c22 in 0u16..1024,
    ) {
        for m in 0..SLOT_COUNT {
            for (layout, ts, counter) in [(IdLayout::Rc21, ts21, c21), (IdLayout::Rc22, ts22, c22)] {
                let id = layout.encode(ts, mid(m.into()), counter);
                prop_assert_eq!(id, reference(layout, ts, m, counter));
                let d = layout.decode(id).expect("a minted ID decodes");
                prop_assert_eq!(d.timestamp_ms, ts);
                prop_assert_eq!(d.machine_id, m);
                prop_assert_eq!(d.counter, counter);
                match layout {
                    IdLayout::Rc21 => {
                        prop_assert_eq!(d.node_id, None);
                        prop_assert_eq!(d.process_id, None);
                    }
                    IdLayout::Rc22 => {
                        prop_assert_eq!(d.node_id, Some(m / 64));
                        prop_assert_eq!(d.process_id, Some(m % 64));
                    }
                }
            }
        }
    }

    #[test]
    fn all_slots_minting_in_the_same_millisecond_never_collide(ts in 0u64..(1 << 39)) {
        for layout in LAYOUTS {
            let max = layout.max_counter();
            let mut seen = HashSet::with_capacity(usize::from(SLOT_COUNT) * 4);
            for m in 0..SLOT_COUNT {
                // Each slot's own generator, all reading the same millisecond.
                let mut generator = IdGenerator::new(layout, mid(m.into()));
                for _ in 0..4 {
                    let id = generator.try_next(ts).expect("counter left");
                    prop_assert!(seen.insert(id), "{} repeated {}", layout, id);
                }
                // And the counter's extremes.
                prop_assert!(seen.insert(layout.encode(ts, mid(m.into()), max)));
                prop_assert!(seen.insert(layout.encode(ts, mid(m.into()), max / 2)));
            }
            prop_assert_eq!(seen.len(), usize::from(SLOT_COUNT) * 6);
        }
    }
}

#[test]
fn two_million_ids_as_fast_as_possible_never_repeat_and_strictly_increase() {
    const N: usize = 2_000_000;
    for layout in LAYOUTS {
        let mut generator = IdGenerator::new(layout, mid(1020));
        let mut seen = HashSet::with_capacity(N);
        let mut last: Option<u64> = None;
        let mut milliseconds = 0usize;
        let mut last_ms = None;
        for _ in 0..N {
            let id = generator.next_with(|| clock::since_epoch_ms(DEFAULT_EPOCH_UNIX_MS));
            let r = id - layout.offset();
            if let Some(prev) = last {
                assert!(r > prev, "{layout}: raw {r} after {prev}");
            }
            last = Some(r);
            assert!(seen.insert(id), "{layout}: {id} repeated");
            let d = layout.decode(id).expect("a minted ID decodes");
            assert_eq!(d.machine_id, 1020);
            if last_ms != Some(d.timestamp_ms) {
                milliseconds += 1;
                last_ms = Some(d.timestamp_ms);
            }
        }
        assert_eq!(seen.len(), N);
        // No millisecond holds more IDs than the counter has values: the
        // generator waited instead of wrapping.
        let per_ms = usize::from(layout.max_counter()) + 1;
        assert!(
            milliseconds >= N.div_ceil(per_ms),
            "{layout}: {N} IDs in only {milliseconds} ms"
        );
    }
}

#[test]
fn a_used_up_counter_waits_for_the_next_millisecond() {
    for layout in LAYOUTS {
        let mut generator = IdGenerator::new(layout, mid(7));
        let per_ms = u32::from(layout.max_counter()) + 1;
        let mut prev = 0;
        for i in 0..per_ms {
            let id = generator.try_next(100).expect("counter left");
            assert!(id > prev);
            assert_eq!(layout.decode(id).map(|d| u32::from(d.counter)), Ok(i));
            prev = id;
        }
        assert_eq!(generator.try_next(100), Err(Exhausted { retry_at_ms: 101 }));
        let next = generator.try_next(101).expect("a new millisecond");
        assert!(next > prev);
        let d = layout.decode(next).expect("decodes");
        assert_eq!((d.timestamp_ms, d.counter), (101, 0));
    }
}

#[test]
fn a_clock_that_steps_back_never_produces_a_repeat() {
    for layout in LAYOUTS {
        let mut generator = IdGenerator::new(layout, mid(3));
        let mut seen = HashSet::new();
        let mut last = 0;
        // Forward, then a step back of a whole second, then forward again
        // through the millisecond used before the step.
        let readings = [
            5000, 5000, 5001, 4000, 4000, 4001, 5001, 5001, 5002, 3, 5002, 6000,
        ];
        for now in readings {
            let id = generator.try_next(now).expect("counter left");
            assert!(seen.insert(id), "{layout}: {id} repeated at clock {now}");
            assert!(id > last, "{layout}: {id} not above {last} at clock {now}");
            last = id;
            let d = layout.decode(id).expect("decodes");
            assert!(d.timestamp_ms >= now.min(5002));
        }
        assert_eq!(layout.decode(last).map(|d| d.timestamp_ms), Ok(6000));
        // While the clock is behind, the generator keeps its own millisecond
        // and uses up its counter there, then refuses rather than repeat.
        let mut behind = IdGenerator::new(layout, mid(3));
        behind.try_next(9000).expect("first");
        let per_ms = u32::from(layout.max_counter()) + 1;
        for _ in 1..per_ms {
            let id = behind.try_next(10).expect("counter left");
            assert_eq!(layout.decode(id).map(|d| d.timestamp_ms), Ok(9000));
        }
        assert_eq!(behind.try_next(10), Err(Exhausted { retry_at_ms: 9001 }));
    }
}

#[test]
fn next_with_waits_by_reading_the_clock_again() {
    let layout = IdLayout::Rc22;
    let mut generator = IdGenerator::new(layout, mid(1));
    let mut now = 50;
    for _ in 0..1024 {
        generator.next_with(|| now);
    }
    // The 1025th ID in millisecond 50 must wait: the fake clock moves on only
    // after it has been read a few more times.
    let mut reads = 0;
    let id = generator.next_with(|| {
        reads += 1;
        if reads > 3 {
            now = 51;
        }
        now
    });
    assert!(reads > 3);
    let d = layout.decode(id).expect("decodes");
    assert_eq!((d.timestamp_ms, d.counter), (51, 0));
}

#[test]
fn a_generator_started_above_a_floor_never_mints_at_or_below_it() {
    for layout in LAYOUTS {
        let mut generator = IdGenerator::above(layout, mid(12), 7000);
        assert_eq!(generator.last_ms(), Some(7000));
        // A clock at or behind the floor: the floor's counter counts as used
        // up, so the generator waits for (or is told to borrow) 7001.
        for now in [0, 6999, 7000] {
            assert_eq!(
                generator.try_next(now),
                Err(Exhausted { retry_at_ms: 7001 }),
                "{layout} at {now}"
            );
        }
        let first = generator.try_next(7001).expect("above the floor");
        let d = layout.decode(first).expect("decodes");
        assert_eq!((d.timestamp_ms, d.counter, d.machine_id), (7001, 0, 12));
        assert_eq!(generator.last_ms(), Some(7001));
        // Back behind the floor: it keeps its own millisecond.
        let second = generator.try_next(10).expect("counter left");
        assert!(second > first);
        assert_eq!(layout.decode(second).map(|d| d.timestamp_ms), Ok(7001));

        // A clock ahead of the floor is used as it is.
        let mut ahead = IdGenerator::above(layout, mid(12), 7000);
        let id = ahead.try_next(9000).expect("ahead");
        assert_eq!(
            layout.decode(id).map(|d| (d.timestamp_ms, d.counter)),
            Ok((9000, 0))
        );
    }
    assert_eq!(IdGenerator::new(IdLayout::Rc22, mid(0)).last_ms(), None);
}
