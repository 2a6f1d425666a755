//! Identity changes as spans of their own: a slot claimed, minting fenced,
//! a lease recovered. Rare (a few per lease lifetime), so each is always
//! recorded, whatever `otel.sampling_ratio`, as a short root span an
//! operator can find next to the results' traces.

use crate::identity::IdentityState;
use crate::metrics::IdentityTracker;

/// One identity change, named as its span is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityEvent {
    /// A slot is held and minting may go on (the first, or after a fence).
    SlotClaimed,
    /// Minting stopped: no valid slot.
    Fenced,
    /// A new lease and slot after the previous one was lost.
    Recovered,
}

impl IdentityEvent {
    pub fn span_name(self) -> &'static str {
        match self {
            IdentityEvent::SlotClaimed => "handoff.identity.slot_claimed",
            IdentityEvent::Fenced => "handoff.identity.fenced",
            IdentityEvent::Recovered => "handoff.identity.recovered",
        }
    }
}

/// Turns the identity's successive states into events. Pure, like the
/// metrics' [`IdentityTracker`] it builds on (which decides recoveries).
#[derive(Debug, Default)]
pub struct IdentityEvents {
    tracker: IdentityTracker,
    /// The last state seen, `None` before the first.
    last: Option<IdentityState>,
}

impl IdentityEvents {
    /// The events `state` means after the states seen before.
    pub fn observe(&mut self, state: &IdentityState) -> Vec<IdentityEvent> {
        let mut events = Vec::new();
        let held = !state.fenced && state.machine_id.is_some();
        let was_held = self
            .last
            .is_some_and(|s| !s.fenced && s.machine_id.is_some());
        let recovered = self.tracker.observe(state);
        let changed = self
            .last
            .is_none_or(|s| s.lease_id != state.lease_id || s.machine_id != state.machine_id);
        if held && (!was_held || changed) {
            events.push(IdentityEvent::SlotClaimed);
        }
        if recovered {
            events.push(IdentityEvent::Recovered);
        }
        if !held && was_held {
            events.push(IdentityEvent::Fenced);
        }
        self.last = Some(*state);
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MachineId;
    use IdentityEvent::{Fenced, Recovered, SlotClaimed};

    fn state(lease: Option<i64>, machine: Option<i128>, fenced: bool) -> IdentityState {
        IdentityState {
            lease_id: lease,
            machine_id: machine.map(|m| MachineId::new(m).unwrap()),
            fenced,
        }
    }

    #[test]
    fn a_lease_lifetime() {
        let mut events = IdentityEvents::default();
        let rows: Vec<(&str, IdentityState, Vec<IdentityEvent>)> = vec![
            (
                "start: slot held",
                state(Some(1), Some(7), false),
                vec![SlotClaimed],
            ),
            (
                "the same state again",
                state(Some(1), Some(7), false),
                vec![],
            ),
            ("lease lost", state(Some(1), Some(7), true), vec![Fenced]),
            ("still fenced", state(None, None, true), vec![]),
            (
                "new lease and slot",
                state(Some(2), Some(9), false),
                vec![SlotClaimed, Recovered],
            ),
            (
                "a new lease seen without the fence between (watch keeps the newest)",
                state(Some(3), Some(9), false),
                vec![SlotClaimed, Recovered],
            ),
        ];
        for (name, s, want) in rows {
            assert_eq!(events.observe(&s), want, "{name}");
        }
    }

    #[test]
    fn a_worker_starting_without_a_slot_reports_nothing_until_it_has_one() {
        let mut events = IdentityEvents::default();
        assert_eq!(events.observe(&state(Some(1), None, true)), vec![]);
        assert_eq!(
            events.observe(&state(Some(1), Some(3), false)),
            vec![SlotClaimed]
        );
    }
}
