//! The worker's identity: an etcd lease, an exclusive machine-ID slot, and the
//! ID generator that may only mint while both are known to be valid.
//!
//! [`Identity`] is a cheap, clonable handle. The etcd side drives it through
//! [`Identity::install`], [`Identity::extend`] and [`Identity::fence`]; the
//! worker mints through it. Minting checks, under one lock, that a slot is held
//! and that its lease cannot have expired yet (`valid_until`), so an ID is
//! never minted with a slot another worker may already have claimed.
//!
//! The etcd side, one file per step:
//! - `lease.rs`: [`Lease`], the API `run` uses: start, shutdown, and the
//!   supervisor task (hold → fence on loss → recover).
//! - `claim.rs`: connect, grant, register, claim a slot; revoke.
//! - `session.rs`: holding a slot: keepalive every TTL/3, the slot-key watch,
//!   the validity deadline.
//! - `keepalive.rs`: one keepalive round trip and the validity it proves.
//! - [`registry`]: key names, the instance record, probe order, the `slots`
//!   listing (pure); `inspect.rs` reads it from etcd.

mod claim;
mod inspect;
mod keepalive;
mod lease;
pub mod registry;
mod session;

pub use inspect::read_slots;
pub use lease::{Lease, LeaseError, Recoveries, Registration};

use crate::clock;
use crate::decision::{IdSource, IdentityUnavailable};
use crate::ids::{IdGenerator, IdLayout, MachineId};
use crate::wire::messages::instance_id;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long one mint may wait for the clock when the counter is used up (or
/// the wall clock stepped back) before it gives up with `identity_unavailable`.
const MAX_MINT_WAIT: Duration = Duration::from_millis(50);

/// What the identity holds right now; published on [`Identity::watch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentityState {
    pub lease_id: Option<i64>,
    pub machine_id: Option<MachineId>,
    /// True while no valid slot is held: minting is refused.
    pub fenced: bool,
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
    generator: Option<IdGenerator>,
    /// Minting is allowed only before this instant: the lease's expiry as
    /// computed from the last successful keepalive (measured from when that
    /// keepalive was sent).
    valid_until: Option<Instant>,
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
                    generator: None,
                    valid_until: None,
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

    /// Starts minting with a freshly claimed slot. `valid_until: None` means
    /// the slot never expires (only for [`Identity::fixed`]).
    pub fn install(&self, lease_id: i64, machine_id: MachineId, valid_until: Option<Instant>) {
        let mut slot = self.lock();
        slot.lease_id = Some(lease_id);
        slot.generator = Some(IdGenerator::new(self.inner.layout, machine_id));
        slot.valid_until = valid_until;
        drop(slot);
        self.publish();
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
        slot.generator = None;
        slot.valid_until = None;
        drop(slot);
        self.publish();
    }

    /// Records a new lease before a slot is claimed with it.
    pub fn set_lease(&self, lease_id: i64) {
        self.lock().lease_id = Some(lease_id);
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
        let deadline = Instant::now() + MAX_MINT_WAIT;
        let mut slot = self.lock();
        let mut ids = Vec::with_capacity(count);
        loop {
            let now = Instant::now();
            if slot.valid_until.is_some_and(|until| now >= until) {
                // The lease may have expired: fence before anything is minted.
                slot.generator = None;
                slot.valid_until = None;
                drop(slot);
                self.publish();
                return Err(IdentityUnavailable(
                    "the etcd lease may have expired; minting is fenced until a new slot is claimed".into(),
                ));
            }
            let Some(generator) = slot.generator.as_mut() else {
                return Err(IdentityUnavailable(
                    "no machine-ID slot is held (fenced while the etcd lease is recovered)".into(),
                ));
            };
            match generator.try_next(clock::since_epoch_ms(self.inner.epoch_unix_ms)) {
                Ok(id) => {
                    ids.push(id);
                    if ids.len() == count {
                        return Ok((ids, generator.machine_id()));
                    }
                }
                Err(_) if now >= deadline => {
                    return Err(IdentityUnavailable(
                        "the ID counter is used up and the clock has not advanced (did the wall clock step back?)".into(),
                    ));
                }
                Err(_) => std::thread::yield_now(),
            }
        }
    }
}

impl IdSource for Identity {
    fn instance_id(&self) -> String {
        instance_id(self.lock().lease_id.unwrap_or(0))
    }

    fn machine_id(&self) -> Option<MachineId> {
        self.state().machine_id
    }

    fn mint(&mut self) -> Result<u64, IdentityUnavailable> {
        self.mint_in_slot().map(|(id, _)| id)
    }

    /// The ID and the slot it came from, read under one lock, so a decode
    /// job never names a slot claimed after its ID was minted.
    fn mint_in_slot(&mut self) -> Result<(u64, Option<MachineId>), IdentityUnavailable> {
        self.mint_many(1)
            .map(|(ids, machine_id)| (ids[0], Some(machine_id)))
    }
}
