//! The etcd side of the identity: lease grant and keepalive, the exclusive
//! machine-ID slot claim, instance registration, fencing and recovery
//! (contract 5).
//!
//! (Skeleton: the API the worker uses. Built by the live-worker issue.)

use super::Identity;
use crate::config::Config;

/// What the instance key advertises besides host, pid, version and start time.
#[derive(Debug, Clone, Default)]
pub struct Registration {
    /// The subjects this worker consumes and publishes.
    pub subjects: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{0}")]
    Etcd(String),
    #[error(
        "all 1021 machine-ID slots under {prefix} are held by live leases; stop a worker or use another namespace"
    )]
    SlotsExhausted { prefix: String },
}

/// A running lease: keeps the [`Identity`] fed with a valid slot, or fenced.
pub struct Lease {
    identity: Identity,
}

impl Lease {
    /// Grants a lease, claims a slot, registers the instance and starts the
    /// keepalive and recovery task.
    pub async fn start(config: &Config, registration: Registration) -> Result<Lease, LeaseError> {
        let _ = (config, registration);
        Err(LeaseError::Etcd(
            "the etcd identity is not built yet".into(),
        ))
    }

    pub fn identity(&self) -> Identity {
        self.identity.clone()
    }

    /// Stops the keepalive and revokes the lease, so the slot frees at once.
    pub async fn shutdown(self) {}
}
