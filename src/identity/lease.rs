//! The etcd side of the identity, as the worker sees it (contract 5):
//! [`Lease::start`] grants a lease, claims a slot and registers the
//! instance; a background task keeps the slot, fences the [`Identity`] the
//! moment it may be lost, and recovers with a new lease and slot;
//! [`Lease::shutdown`] revokes the lease so the slot frees at once.

use super::Identity;
use super::claim::{self, Claimed};
use super::etcd::{LeaseError, Settings};
use super::floor;
use super::registry::{InstanceRecord, Keys, rfc3339};
use super::session::{self, Ended};
use crate::config::Config;
use crate::wire::messages::instance_id;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// What the instance key advertises besides host, pid, version and start time.
#[derive(Debug, Clone, Default)]
pub struct Registration {
    /// The subjects this worker consumes and publishes.
    pub subjects: Vec<String>,
}

/// How many times the identity recovered from a lost lease; clonable, for
/// metrics.
#[derive(Debug, Clone, Default)]
pub struct Recoveries(Arc<AtomicU64>);

impl Recoveries {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn bump(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A running lease: keeps the [`Identity`] fed with a valid slot, or fenced.
pub struct Lease {
    identity: Identity,
    recoveries: Recoveries,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    /// How long [`Lease::shutdown`] waits for the revoke.
    shutdown_bound: Duration,
}

impl Lease {
    /// Grants a lease, claims a slot, registers the instance and starts the
    /// keepalive and recovery task.
    pub async fn start(config: &Config, registration: Registration) -> Result<Lease, LeaseError> {
        let identity = Identity::new(config.id_layout, config.epoch_unix_ms()?);
        let settings = Settings {
            etcd: config.etcd.clone(),
            keys: Keys::new(&config.namespace),
            // The key table bounds it far below i64::MAX (etcd's longest lease).
            ttl_secs: i64::try_from(config.lease_ttl_secs).unwrap_or(i64::MAX),
            record: InstanceRecord {
                host: hostname(),
                pid: std::process::id(),
                machine_id: None,
                version: env!("CARGO_PKG_VERSION").into(),
                subjects: registration.subjects,
                started_at: rfc3339(SystemTime::now()),
            },
        };
        let claimed = claim::establish(&settings, &identity).await?;
        install(&identity, &claimed);
        info!(
            lease = %instance_id(claimed.lease_id),
            machine_id = claimed.machine_id.get(),
            slot = %settings.keys.slot(claimed.machine_id),
            "machine-ID slot claimed; minting enabled"
        );

        let (stop, stop_rx) = watch::channel(false);
        let recoveries = Recoveries::default();
        // Two requests: lowering the ID floor, then the revoke.
        let shutdown_bound = settings.request_timeout() * 2 + Duration::from_secs(1);
        let task = tokio::spawn(supervise(
            settings,
            identity.clone(),
            claimed,
            stop_rx,
            recoveries.clone(),
        ));
        Ok(Lease {
            identity,
            recoveries,
            stop,
            task: Some(task),
            shutdown_bound,
        })
    }

    pub fn identity(&self) -> Identity {
        self.identity.clone()
    }

    /// How many times a lost lease was replaced by a new lease and slot.
    pub fn recoveries(&self) -> Recoveries {
        self.recoveries.clone()
    }

    /// Stops minting and the keepalive, lowers the slot's ID floor to the
    /// last minted millisecond, and revokes the lease so the slot and
    /// instance keys vanish at once. Bounded by twice `etcd.request_timeout_ms`
    /// (plus a second): a dead etcd cannot hang shutdown.
    pub async fn shutdown(mut self) {
        self.identity.fence();
        self.stop.send_replace(true);
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(self.shutdown_bound, &mut task)
                .await
                .is_err()
        {
            warn!("the lease was not revoked in time; it expires after its TTL");
            task.abort();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Dropped without `shutdown`: the task still fences and revokes.
        self.stop.send_replace(true);
    }
}

fn install(identity: &Identity, claimed: &Claimed) {
    identity.install_reserved(
        claimed.lease_id,
        claimed.machine_id,
        claimed.valid_until,
        claimed.reservation,
    );
}

/// Holds the slot; on loss fences, then recovers with a new lease and slot;
/// on stop fences and revokes.
async fn supervise(
    settings: Settings,
    identity: Identity,
    mut claimed: Claimed,
    mut stop: watch::Receiver<bool>,
    recoveries: Recoveries,
) {
    loop {
        let loss = match session::hold(&settings, &mut claimed, &identity, &mut stop).await {
            Ended::Shutdown => {
                identity.fence();
                floor::settle(&settings, claimed.holder(), &identity).await;
                claim::revoke(&settings, &claimed.client, claimed.lease_id).await;
                return;
            }
            Ended::Lost(loss) => loss,
        };
        identity.fence();
        let old_hex = instance_id(claimed.lease_id);
        let old_slot = claimed.machine_id.get();
        warn!(
            lease = %old_hex,
            machine_id = old_slot,
            reason = %loss,
            "identity fenced: minting stops until a new slot is claimed"
        );
        // Free the old slot now rather than after its TTL. If etcd is down
        // this fails; it is tried again once etcd answers, because a
        // restarted etcd renews every lease and the old slot would linger.
        let old_lease = claimed.lease_id;
        let mut unrevoked = (loss.lease_may_live()
            && !claim::revoke(&settings, &claimed.client, old_lease).await)
            .then_some(old_lease);
        let recovered = recover(
            &settings,
            &identity,
            &mut stop,
            &claimed.client,
            &mut unrevoked,
        )
        .await;
        // Still alive after recovery's retries (stopped while waiting for a
        // slot, or a slot found before a retry got through): one last try.
        // Seen in the 1021-identity test: three workers whose revoke failed
        // were still waiting for a free slot (their own, among others) when
        // shut down, and their slots outlived them.
        if let Some(lease) = unrevoked {
            claim::revoke(&settings, &claimed.client, lease).await;
        }
        let Some(fresh) = recovered else {
            return;
        };
        claimed = fresh;
        // Counted first: whoever sees the new slot installed (a test, the
        // readiness probe) sees the recovery counted too.
        recoveries.bump();
        install(&identity, &claimed);
        info!(
            old_lease = %old_hex,
            old_machine_id = old_slot,
            lease = %instance_id(claimed.lease_id),
            machine_id = claimed.machine_id.get(),
            "identity recovered: new lease and slot; minting enabled"
        );
    }
}

/// Grants, claims and registers again, retrying with capped exponential
/// backoff while etcd is down or every slot is taken. `None` on stop.
///
/// `unrevoked` is the lost lease when revoking it failed: it is revoked
/// again through `old_client` before each retry (and set to `None` once
/// gone), since while it lives its slot stays taken, and when every other
/// slot is taken too that slot is the only one this worker could get.
async fn recover(
    settings: &Settings,
    identity: &Identity,
    stop: &mut watch::Receiver<bool>,
    old_client: &etcd_client::Client,
    unrevoked: &mut Option<i64>,
) -> Option<Claimed> {
    let cap = Duration::from_secs(settings.ttl_secs.unsigned_abs())
        .clamp(Duration::from_millis(500), Duration::from_secs(5));
    let mut backoff = Duration::from_millis(100);
    loop {
        if *stop.borrow() {
            return None;
        }
        let attempt = tokio::select! {
            attempt = claim::establish(settings, identity) => attempt,
            _ = session::stopped(stop) => return None,
        };
        match attempt {
            Ok(claimed) => return Some(claimed),
            Err(e) => {
                warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "identity recovery failed; retrying");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = session::stopped(stop) => return None,
        }
        backoff = (backoff * 2).min(cap);
        if let Some(lease) = *unrevoked {
            let revoked = tokio::select! {
                revoked = claim::revoke(settings, old_client, lease) => revoked,
                _ = session::stopped(stop) => return None,
            };
            if revoked {
                *unrevoked = None;
            }
        }
    }
}

/// The host name the kernel reports, for the instance record.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "unknown".into())
}
