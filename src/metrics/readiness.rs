//! What `/readyz` checks: the worker is ready only while NATS is connected, a
//! lease and machine-ID slot are held (not fenced), it is consuming, and
//! the GEN stream accepts its decode jobs (JetStream mode).
//!
//! A load balancer or Kubernetes takes a worker that is not ready out of
//! rotation; a worker that is recovering its lease, reconnecting, draining
//! or holding results GEN refuses reports which of the four it is missing.
//!
//! Beside the four, the last permissions violation the NATS server reported:
//! the JetStream start reads it to tell a refused API request (a request
//! the server dropped answers nothing, like a server not ready) from one
//! that may yet be answered.

use crate::identity::IdentityState;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;

/// Cheap, clonable readiness flags. The slot comes from the identity's watch;
/// the transport sets the other two.
#[derive(Clone)]
pub struct Readiness {
    inner: Arc<Inner>,
}

struct Inner {
    nats_connected: AtomicBool,
    consuming: AtomicBool,
    gen_accepting: AtomicBool,
    identity: watch::Receiver<IdentityState>,
    /// The server's words, as its `-ERR` had them.
    permission_violation: Mutex<Option<String>>,
}

/// One reading of the three conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadinessReport {
    pub nats_connected: bool,
    pub slot_held: bool,
    pub consuming: bool,
    pub gen_accepting: bool,
}

impl ReadinessReport {
    pub fn ready(&self) -> bool {
        self.missing().is_empty()
    }

    /// The names of the conditions that do not hold.
    pub fn missing(&self) -> Vec<&'static str> {
        [
            (self.nats_connected, "nats_connected"),
            (self.slot_held, "slot_held"),
            (self.consuming, "consuming"),
            (self.gen_accepting, "gen_accepting"),
        ]
        .into_iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, name)| name)
        .collect()
    }

    /// The `/readyz` body: `{"ready": bool, "missing": [names]}`.
    pub fn to_json(&self) -> String {
        serde_json::json!({ "ready": self.ready(), "missing": self.missing() }).to_string()
    }
}

impl Readiness {
    /// Starts not ready: NATS not connected, not consuming; the slot is
    /// whatever `identity` (from `Identity::watch`) says; GEN accepts until
    /// it refuses a decode job.
    pub fn new(identity: watch::Receiver<IdentityState>) -> Readiness {
        Readiness {
            inner: Arc::new(Inner {
                nats_connected: AtomicBool::new(false),
                consuming: AtomicBool::new(false),
                gen_accepting: AtomicBool::new(true),
                identity,
                permission_violation: Mutex::new(None),
            }),
        }
    }

    pub fn set_nats_connected(&self, connected: bool) {
        self.inner
            .nats_connected
            .store(connected, Ordering::Relaxed);
    }

    /// True once the transport takes input; false again when it drains.
    pub fn set_consuming(&self, consuming: bool) {
        self.inner.consuming.store(consuming, Ordering::Relaxed);
    }

    /// False while the GEN stream refuses decode jobs (`pipeline::gen_gate`).
    pub fn set_gen_accepting(&self, accepting: bool) {
        self.inner.gen_accepting.store(accepting, Ordering::Relaxed);
    }

    /// The NATS server refused one of the worker's publications or
    /// subscriptions: `violation` is its `-ERR` text.
    pub fn set_permission_violation(&self, violation: String) {
        *self
            .inner
            .permission_violation
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(violation);
    }

    /// The last permissions violation the NATS server reported, if any.
    pub fn permission_violation(&self) -> Option<String> {
        self.inner
            .permission_violation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn report(&self) -> ReadinessReport {
        let identity = *self.inner.identity.borrow();
        ReadinessReport {
            nats_connected: self.inner.nats_connected.load(Ordering::Relaxed),
            slot_held: !identity.fenced && identity.machine_id.is_some(),
            consuming: self.inner.consuming.load(Ordering::Relaxed),
            gen_accepting: self.inner.gen_accepting.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use crate::ids::{DEFAULT_EPOCH_UNIX_MS, IdLayout, MachineId};

    #[test]
    fn ready_only_when_all_four_hold() {
        let identity = Identity::new(IdLayout::Rc22, DEFAULT_EPOCH_UNIX_MS);
        let readiness = Readiness::new(identity.watch());
        let missing = |r: &Readiness| r.report().missing();
        assert_eq!(
            missing(&readiness),
            ["nats_connected", "slot_held", "consuming"]
        );
        readiness.set_nats_connected(true);
        readiness.set_consuming(true);
        assert_eq!(missing(&readiness), ["slot_held"]);
        identity.install(5, MachineId::new(5).unwrap(), None);
        assert!(readiness.report().ready());
        assert_eq!(
            readiness.report().to_json(),
            r#"{"missing":[],"ready":true}"#
        );
        identity.fence();
        assert_eq!(missing(&readiness), ["slot_held"]);
        identity.install(6, MachineId::new(6).unwrap(), None);
        readiness.set_consuming(false);
        assert_eq!(missing(&readiness), ["consuming"]);
        readiness.set_consuming(true);
        readiness.set_gen_accepting(false);
        assert_eq!(missing(&readiness), ["gen_accepting"]);
        readiness.set_gen_accepting(true);
        assert!(readiness.report().ready());
    }
}
