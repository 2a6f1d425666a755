//! The worker's identity: an etcd lease, an exclusive machine-ID slot, and the
//! ID generator that may only mint while both are known to be valid.
//!
//! [`Identity`] is a cheap, clonable handle. The etcd side drives it through
//! [`Identity::install`], [`Identity::extend`] and [`Identity::fence`]; the
//! worker mints through it. Minting checks, under one lock, that a slot is held
//! and that the millisecond is within the slot's reservation (below), so no
//! ID is ever one another holder of the slot mints. The reservation, not the
//! lease's last confirmation, is the bound: an etcd leader election or a
//! short outage does not stop minting.
//!
//! IDs never repeat across successive holders of a slot either (contract 6):
//! each slot has an ID floor in etcd, the highest millisecond its holder may
//! have minted in. A holder mints only up to the floor it has written (its
//! reservation, [`Reservation`]), and a new holder starts above the floor it
//! read, whatever its own clock says. Within the process, the millisecond never
//! goes back across installs either (`high_water_ms`).
//!
//! The etcd side, one file per step:
//! - `lease.rs`: [`Lease`], the API `run` uses: start, shutdown, and the
//!   supervisor task (hold → fence on loss → recover).
//! - `claim.rs`: connect, grant, register, claim a slot; revoke.
//! - `etcd.rs`: what every step shares: the settings, requests bounded in
//!   time or failing over, [`LeaseError`].
//! - `session.rs`: holding a slot: keepalive every TTL/3, the slot-key watch,
//!   the validity deadline.
//! - `keepalive.rs`: one keepalive round trip and the validity it proves.
//! - `floor.rs`: the slot's ID floor in etcd: read at the claim, renewed every
//!   TTL/3 on its own schedule (beside the keepalive), lowered to the last
//!   minted millisecond on shutdown.
//! - [`registry`]: key names, the instance record, probe order, the `slots`
//!   listing (pure); `inspect.rs` reads it from etcd (and writes a floor
//!   as a given lease, for a test).

mod claim;
mod etcd;
mod floor;
mod inspect;
mod keepalive;
mod lease;
pub mod registry;
mod session;

pub use etcd::{EtcdError, LeaseError};
pub use inspect::read_slots;
#[doc(hidden)]
pub use inspect::write_floor_as;
pub use lease::{Lease, Recoveries, Registration};

use crate::clock;
use crate::decision::{IdSource, IdentityUnavailable, Minted};
use crate::ids::{Exhausted, IdGenerator, IdLayout, MachineId};
use crate::wire::messages::InstanceId;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tokio::sync::watch;

/// What the identity holds right now; published on [`Identity::watch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentityState {
    pub lease_id: Option<i64>,
    pub machine_id: Option<MachineId>,
    /// True while no valid slot is held: minting is refused.
    pub fenced: bool,
}

/// The ID milliseconds a claimed slot may mint in, from its floor in etcd:
/// above `above_ms` (the floor the previous holder left; `None` when the slot
/// has none) and up to `until_ms` (the floor this holder has written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub above_ms: Option<u64>,
    pub until_ms: u64,
}

#[derive(Clone)]
pub struct Identity {
    inner: Arc<Inner>,
}

struct Inner {
    layout: IdLayout,
    epoch_unix_ms: u64,
    slot: Mutex<Slot>,
    state: watch::Sender<IdentityState>,
}

struct Slot {
    lease_id: Option<i64>,
    /// `lease_id` as decode jobs name it (0 without a lease): written with
    /// it by [`Slot::set_lease`], so the 16 digits are not formatted per job.
    instance_id: InstanceId,
    generator: Option<IdGenerator>,
    /// The lease's expiry as computed from the last successful keepalive
    /// (measured from when that keepalive was sent). It gates minting only
    /// for installs without a reservation (`reserved_until_ms` is `None`).
    valid_until: Option<Instant>,
    /// Minting is allowed only in milliseconds up to this one: the ID floor
    /// written to etcd. `None`: no floor (installs without etcd).
    ///
    /// This alone gates minting of a slot claimed in etcd, whether or not
    /// the lease can be confirmed right now: every floor write succeeded
    /// while the slot key was still attached to this lease, and the next
    /// holder's claim reads the floor atomically with taking the slot, so
    /// it starts above everything up to here. An etcd leader election or a
    /// short outage is then invisible; only a reservation used up is not.
    reserved_until_ms: Option<u64>,
    /// The highest millisecond a retired generator of this process minted in
    /// (or was started above): the next generator starts above it.
    high_water_ms: Option<u64>,
}

impl Slot {
    fn set_lease(&mut self, lease_id: i64) {
        self.lease_id = Some(lease_id);
        self.instance_id = InstanceId::of(lease_id);
    }

    /// Stops minting, remembering how far the generator got.
    fn retire(&mut self) {
        if let Some(last) = self.generator.take().and_then(|g| g.last_ms()) {
            self.high_water_ms = self.high_water_ms.max(Some(last));
        }
        self.valid_until = None;
        self.reserved_until_ms = None;
    }

    /// The highest millisecond minted in (or started above) by this process.
    fn high_water_ms(&self) -> Option<u64> {
        let current = self.generator.as_ref().and_then(IdGenerator::last_ms);
        self.high_water_ms.max(current)
    }
}

impl Identity {
    /// An identity with no lease and no slot: fenced until [`Identity::install`].
    pub fn new(layout: IdLayout, epoch_unix_ms: u64) -> Identity {
        let (state, _) = watch::channel(IdentityState {
            lease_id: None,
            machine_id: None,
            fenced: true,
        });
        Identity {
            inner: Arc::new(Inner {
                layout,
                epoch_unix_ms,
                slot: Mutex::new(Slot {
                    lease_id: None,
                    instance_id: InstanceId::of(0),
                    generator: None,
                    valid_until: None,
                    reserved_until_ms: None,
                    high_water_ms: None,
                }),
                state,
            }),
        }
    }

    /// An identity that holds `machine_id` forever, with no etcd behind it:
    /// for `explain` and for tests of the core. Never use it in `run`.
    pub fn fixed(layout: IdLayout, epoch_unix_ms: u64, machine_id: MachineId) -> Identity {
        let identity = Identity::new(layout, epoch_unix_ms);
        identity.install(0, machine_id, None);
        identity
    }

    pub fn layout(&self) -> IdLayout {
        self.inner.layout
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        // A panic while holding this lock cannot leave the slot half-updated
        // (every update is a plain assignment), so a poisoned lock is usable.
        self.inner
            .slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts minting with a freshly claimed slot, with no ID floor to
    /// respect beyond this process's own. `valid_until: None` means the slot
    /// never expires (only for [`Identity::fixed`] and tests).
    pub fn install(&self, lease_id: i64, machine_id: MachineId, valid_until: Option<Instant>) {
        self.install_with(lease_id, machine_id, valid_until, None);
    }

    /// Starts minting with a slot claimed in etcd: above the floor the
    /// previous holder left, and up to the floor this holder has written.
    pub fn install_reserved(
        &self,
        lease_id: i64,
        machine_id: MachineId,
        valid_until: Instant,
        reservation: Reservation,
    ) {
        self.install_with(lease_id, machine_id, Some(valid_until), Some(reservation));
    }

    fn install_with(
        &self,
        lease_id: i64,
        machine_id: MachineId,
        valid_until: Option<Instant>,
        reservation: Option<Reservation>,
    ) {
        let mut slot = self.lock();
        slot.retire();
        // Never below what this process minted before, nor below what the
        // slot's previous holder may have minted.
        let floor = slot.high_water_ms.max(reservation.and_then(|r| r.above_ms));
        let layout = self.inner.layout;
        slot.generator = Some(match floor {
            Some(floor) => IdGenerator::above(layout, machine_id, floor),
            None => IdGenerator::new(layout, machine_id),
        });
        slot.set_lease(lease_id);
        slot.valid_until = valid_until;
        slot.reserved_until_ms = reservation.map(|r| r.until_ms);
        drop(slot);
        self.publish();
    }

    /// Milliseconds since the ID epoch, by the wall clock: the `ts` of an ID
    /// minted now (unless the generator is ahead of the clock).
    fn now_ms(&self) -> u64 {
        clock::since_epoch_ms(self.inner.epoch_unix_ms)
    }

    /// The highest ID millisecond this process has minted in (or started a
    /// generator above); `None` before anything was minted or installed above
    /// a floor.
    pub fn high_water_ms(&self) -> Option<u64> {
        self.lock().high_water_ms()
    }

    /// The floor to write when renewing the reservation: the clock or the
    /// last minted millisecond, whichever is later, plus `window_ms`; never
    /// below the reservation held now (IDs up to it may be minted meanwhile).
    /// `None` while fenced: there is nothing to renew.
    fn renewal_floor(&self, window_ms: u64) -> Option<u64> {
        let now_ms = self.now_ms();
        let slot = self.lock();
        slot.generator.as_ref()?;
        let wanted = now_ms.max(slot.high_water_ms().unwrap_or(0)) + window_ms;
        Some(wanted.max(slot.reserved_until_ms.unwrap_or(0)))
    }

    /// How many milliseconds of the reservation are left by the clock;
    /// `None` without a reservation. The reserved millisecond itself is
    /// the last one IDs may be minted in, so it counts: 0 exactly when
    /// minting is refused. (Counted out, 0 would be reported for a
    /// millisecond that still mints.)
    pub fn reserved_for_ms(&self) -> Option<u64> {
        let now_ms = self.now_ms();
        self.lock()
            .reserved_until_ms
            .map(|until| until.saturating_add(1).saturating_sub(now_ms))
    }

    /// Records a floor written to etcd: minting may go up to `until_ms`.
    /// Never shrinks the reservation; ignored while fenced.
    fn reserve(&self, until_ms: u64) {
        let mut slot = self.lock();
        if slot.generator.is_some() && slot.reserved_until_ms.is_some() {
            slot.reserved_until_ms = slot.reserved_until_ms.max(Some(until_ms));
        }
    }

    /// Records a successful keepalive: the lease is valid until `valid_until`.
    pub fn extend(&self, valid_until: Instant) {
        let mut slot = self.lock();
        if slot.generator.is_some() {
            slot.valid_until = Some(valid_until);
        }
    }

    /// Stops minting at once: the lease is lost or may be.
    pub fn fence(&self) {
        let mut slot = self.lock();
        slot.retire();
        drop(slot);
        self.publish();
    }

    /// Records a new lease before a slot is claimed with it.
    pub fn set_lease(&self, lease_id: i64) {
        self.lock().set_lease(lease_id);
        self.publish();
    }

    fn publish(&self) {
        let state = self.state();
        self.inner.state.send_replace(state);
    }

    pub fn state(&self) -> IdentityState {
        let slot = self.lock();
        IdentityState {
            lease_id: slot.lease_id,
            machine_id: slot.generator.as_ref().map(IdGenerator::machine_id),
            fenced: slot.generator.is_none(),
        }
    }

    pub fn watch(&self) -> watch::Receiver<IdentityState> {
        self.inner.state.subscribe()
    }

    pub fn is_fenced(&self) -> bool {
        self.state().fenced
    }

    /// Mints `count` IDs from the slot held now.
    pub fn mint_many(&self, count: usize) -> Result<(Vec<u64>, MachineId), IdentityUnavailable> {
        self.mint_many_at(count, || self.now_ms())
    }

    /// [`Identity::mint_many`] with the time (milliseconds since the ID
    /// epoch) read from `clock`.
    fn mint_many_at(
        &self,
        count: usize,
        clock: impl FnMut() -> u64,
    ) -> Result<(Vec<u64>, MachineId), IdentityUnavailable> {
        let mut ids = Vec::with_capacity(count);
        let (machine_id, _) = self.mint_each(count, clock, |id| ids.push(id))?;
        Ok((ids, machine_id))
    }

    /// Mints `count` IDs (at least one) under one lock, handing each to
    /// `take`; the slot and the instance they came from.
    fn mint_each(
        &self,
        count: usize,
        mut clock: impl FnMut() -> u64,
        mut take: impl FnMut(u64),
    ) -> Result<(MachineId, InstanceId), IdentityUnavailable> {
        let mut slot = self.lock();
        let mut taken = 0;
        loop {
            // With a reservation in etcd the lease's validity does not gate
            // minting: the floor bounds it (see `Slot::reserved_until_ms`).
            // The monotonic clock is read only when it does.
            let lease_bound = slot.reserved_until_ms.is_none();
            if lease_bound
                && slot
                    .valid_until
                    .is_some_and(|until| Instant::now() >= until)
            {
                // The lease may have expired: fence before anything is minted.
                slot.retire();
                drop(slot);
                self.publish();
                return Err(IdentityUnavailable(
                    "the etcd lease may have expired; minting is fenced until a new slot is claimed".into(),
                ));
            }
            let reserved = slot.reserved_until_ms;
            let Some(generator) = slot.generator.as_mut() else {
                return Err(IdentityUnavailable(
                    "no machine-ID slot is held (fenced while the etcd lease is recovered)".into(),
                ));
            };
            let now_ms = clock();
            if let Some(reserved) = reserved.filter(|r| now_ms > *r) {
                return Err(IdentityUnavailable(format!(
                    "the clock ({now_ms} ms since the ID epoch) is past the ID floor reserved in etcd ({reserved} ms); minting resumes once the reservation is renewed"
                )));
            }
            // Never waits: minting runs under a std Mutex on a runtime
            // thread, where waiting for the clock would stall every task on
            // that thread. When the counter is
            // used up in the generator's millisecond, the next millisecond is
            // taken at once, as long as it is within the reservation: still
            // unique and increasing, and the ID service's budget
            // (`id_service.ids_per_sec`, at most half a slot's rate) keeps
            // the generator close to the clock.
            let minted = match generator.try_next(now_ms) {
                Err(Exhausted { retry_at_ms }) if reserved.is_none_or(|r| retry_at_ms <= r) => {
                    generator.try_next(retry_at_ms)
                }
                other => other,
            };
            match minted {
                Ok(id) => {
                    take(id);
                    taken += 1;
                    if taken >= count {
                        let machine_id = generator.machine_id();
                        return Ok((machine_id, slot.instance_id));
                    }
                }
                Err(_) => {
                    return Err(IdentityUnavailable(
                        "the ID counter is used up up to the ID floor reserved in etcd; minting resumes once the reservation is renewed".into(),
                    ));
                }
            }
        }
    }
}

impl Identity {
    /// One ID, the slot it came from and the instance holding it, read
    /// under one lock, so a decode job never names a slot claimed or a
    /// lease granted after its ID was minted.
    fn mint_one(&self) -> Result<Minted, IdentityUnavailable> {
        let mut id = 0;
        let (machine_id, instance_id) =
            self.mint_each(1, || self.now_ms(), |minted| id = minted)?;
        Ok(Minted {
            id,
            machine_id: Some(machine_id),
            instance_id,
        })
    }
}

impl IdSource for Identity {
    fn instance_id(&self) -> InstanceId {
        self.lock().instance_id
    }

    fn machine_id(&self) -> Option<MachineId> {
        self.state().machine_id
    }

    fn mint(&mut self) -> Result<u64, IdentityUnavailable> {
        self.mint_one().map(|minted| minted.id)
    }

    fn mint_for_job(&mut self) -> Result<Minted, IdentityUnavailable> {
        self.mint_one()
    }
}

/// The same, through a shared reference: what the pipeline decides with,
/// so no handle is cloned per message (an atomic count every worker thread
/// touches).
impl IdSource for &Identity {
    fn instance_id(&self) -> InstanceId {
        (**self).instance_id()
    }

    fn machine_id(&self) -> Option<MachineId> {
        (**self).machine_id()
    }

    fn mint(&mut self) -> Result<u64, IdentityUnavailable> {
        self.mint_one().map(|minted| minted.id)
    }

    fn mint_for_job(&mut self) -> Result<Minted, IdentityUnavailable> {
        self.mint_one()
    }
}

#[cfg(test)]
mod tests;
