//! Holding a claimed slot: keepalive every TTL/3, the renewal of the slot's
//! ID floor beside it on its own schedule, a watch on the slot key, and the
//! deadline after which the lease may have expired.
//!
//! The slot is lost when the keepalive answers TTL 0, when the slot key
//! changes under us (deleted by a revoke or by hand, or overwritten), or when
//! etcd refuses a floor write because the key is no longer ours. etcd not
//! answering does not lose it at once: the holder keeps trying (a new etcd
//! leader keeps every lease), and minting meanwhile stays within the
//! reservation. Once the reservation is used up with etcd still silent, the
//! slot is given up (fenced), and a new one claimed when etcd answers.

use super::Identity;
use super::claim::Claimed;
use super::etcd::{LeaseError, Settings};
use super::floor;
use super::keepalive::Beat;
use crate::wire::messages::instance_id;
use etcd_client::{WatchOptions, WatchStream};
use std::fmt;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{debug, warn};

/// Why a held slot ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ended {
    /// The owner asked to stop.
    Shutdown,
    Lost(Loss),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Loss {
    /// The keepalive answered TTL 0: the lease expired or was revoked.
    LeaseGone,
    /// etcd did not confirm the lease before the slot's reservation (its ID
    /// floor) was used up; or, without a reservation, a mint found the
    /// lease's validity run out and fenced the identity.
    Unreachable,
    /// The slot key was deleted or rewritten while the lease lived.
    SlotChanged,
}

impl Loss {
    /// Whether the lease itself may still be alive (and is worth revoking).
    pub(super) fn lease_may_live(&self) -> bool {
        !matches!(self, Loss::LeaseGone)
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Loss::LeaseGone => "the keepalive answered TTL 0 (lease expired or revoked)",
            Loss::Unreachable => {
                "no keepalive confirmed the lease before its reservation or validity ran out"
            }
            Loss::SlotChanged => "the slot key was deleted or rewritten",
        })
    }
}

/// Keeps the slot until it is lost or `stop` turns true (or its sender
/// drops), extending `identity` after every successful keepalive and
/// renewing the ID floor on its own schedule (`floor::keep_renewing`): a
/// keepalive or a watch waiting on etcd never delays a renewal.
pub(super) async fn hold(
    settings: &Settings,
    claimed: &mut Claimed,
    identity: &Identity,
    stop: &mut watch::Receiver<bool>,
) -> Ended {
    let floor_client = claimed.client.clone();
    let holder = floor::Holder {
        client: &floor_client,
        lease_id: claimed.lease_id,
        machine_id: claimed.machine_id,
        ttl: claimed.ttl,
    };
    // The claim wrote the first reservation as the lease was granted.
    let first_renewal = claimed.valid_until - claimed.ttl + floor::renewal_interval(claimed.ttl);
    tokio::select! {
        ended = keep_alive(settings, claimed, identity, stop) => ended,
        () = floor::keep_renewing(settings, holder, identity, first_renewal) => {
            Ended::Lost(Loss::SlotChanged)
        }
    }
}

/// The keepalive every TTL/3 and the watch on the slot key.
async fn keep_alive(
    settings: &Settings,
    claimed: &mut Claimed,
    identity: &Identity,
    stop: &mut watch::Receiver<bool>,
) -> Ended {
    let hex = instance_id(claimed.lease_id);
    let interval = claimed.ttl / 3;
    let retry = (claimed.ttl / 10).max(Duration::from_millis(100));
    let mut next_beat = claimed.valid_until - claimed.ttl + interval;
    let mut slot_watch = match open_watch(settings, claimed, claimed.revision + 1).await {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(lease = %hex, error = %e, "cannot watch the slot key; relying on the keepalive");
            None
        }
    };

    loop {
        tokio::select! {
            _ = stopped(stop) => return Ended::Shutdown,
            news = next_change(&mut slot_watch) => match news {
                WatchNews::Changed => return Ended::Lost(Loss::SlotChanged),
                WatchNews::Broken(e) => {
                    debug!(lease = %hex, error = %e, "slot watch broke; reopening after the next keepalive");
                    slot_watch = None;
                }
            },
            _ = tokio::time::sleep_until(next_beat.into()) => {
                // No deadline from the lease's validity: a lease that cannot be
                // confirmed is not given up while the reservation lasts
                // (minting is bounded by it, not by the lease). Bounded by
                // etcd.request_timeout_ms.
                let deadline = Instant::now() + settings.request_timeout();
                let beat = tokio::select! {
                    beat = claimed.keepalive.beat(deadline) => beat,
                    _ = stopped(stop) => return Ended::Shutdown,
                };
                match beat {
                    Ok(Beat::Alive { valid_until }) => {
                        claimed.valid_until = valid_until;
                        identity.extend(valid_until);
                        if identity.is_fenced() {
                            return Ended::Lost(Loss::Unreachable);
                        }
                        next_beat = Instant::now() + interval;
                        if slot_watch.is_none() {
                            match reopen_watch(settings, claimed).await {
                                Ok(w) => slot_watch = Some(w),
                                Err(WatchNews::Changed) => return Ended::Lost(Loss::SlotChanged),
                                Err(WatchNews::Broken(e)) => {
                                    debug!(lease = %hex, error = %e, "cannot reopen the slot watch yet");
                                }
                            }
                        }
                    }
                    Ok(Beat::Gone) => return Ended::Lost(Loss::LeaseGone),
                    // Unconfirmed and nothing left to mint with: say so
                    // (fenced, not ready) instead of holding a slot that
                    // refuses every mint. The lease may still live (a new
                    // etcd leader keeps it); supervise revokes it once etcd
                    // answers, and recovery claims a slot afresh.
                    Err(_) if identity.reserved_for_ms() == Some(0) => {
                        return Ended::Lost(Loss::Unreachable);
                    }
                    Err(e) => {
                        warn!(
                            lease = %hex,
                            machine_id = claimed.machine_id.get(),
                            error = %e,
                            reserved_for_ms = identity.reserved_for_ms(),
                            "keepalive failed; retrying (minting continues within the reservation)"
                        );
                        next_beat = Instant::now() + retry;
                    }
                }
            }
        }
    }
}

/// Resolves when `stop` turns true or its sender is dropped.
pub(super) async fn stopped(stop: &mut watch::Receiver<bool>) {
    // `wait_for` errs only when the sender is gone: that is a stop too.
    let _ = stop.wait_for(|s| *s).await;
}

enum WatchNews {
    Changed,
    Broken(WatchBroken),
}

/// Why the slot watch stopped telling us anything; it is reopened.
#[derive(Debug, thiserror::Error)]
enum WatchBroken {
    #[error("{0}")]
    Request(#[from] LeaseError),
    #[error("etcd canceled the watch (compact revision {compact_revision}): {reason}")]
    Canceled {
        compact_revision: i64,
        reason: String,
    },
    #[error("etcd closed the watch stream")]
    Closed,
    #[error("the watch failed: {0}")]
    Failed(#[source] etcd_client::Error),
}

async fn open_watch(
    settings: &Settings,
    claimed: &Claimed,
    start_revision: i64,
) -> Result<WatchStream, LeaseError> {
    let key = settings.keys.slot(claimed.machine_id);
    let options = WatchOptions::new().with_start_revision(start_revision);
    settings
        .bounded(
            "watching the slot key",
            claimed.client.watch_client().watch(key, Some(options)),
        )
        .await
}

/// After the watch broke, events may have been missed: check that the slot
/// key is still the one we created, then watch from the revision read.
async fn reopen_watch(settings: &Settings, claimed: &Claimed) -> Result<WatchStream, WatchNews> {
    let key = settings.keys.slot(claimed.machine_id);
    let answer = settings
        .bounded(
            "reading the slot key",
            claimed.client.kv_client().get(key, None),
        )
        .await
        .map_err(|e| WatchNews::Broken(e.into()))?;
    let ours = answer.kvs().first().is_some_and(|kv| {
        kv.lease() == claimed.lease_id && kv.create_revision() == claimed.revision
    });
    if !ours {
        return Err(WatchNews::Changed);
    }
    let revision = answer.header().map_or(claimed.revision, |h| h.revision());
    open_watch(settings, claimed, revision + 1)
        .await
        .map_err(|e| WatchNews::Broken(e.into()))
}

/// The next thing that matters on the slot watch; pending forever without one.
async fn next_change(slot_watch: &mut Option<WatchStream>) -> WatchNews {
    let Some(stream) = slot_watch else {
        return std::future::pending().await;
    };
    loop {
        match stream.message().await {
            Ok(Some(answer)) if !answer.events().is_empty() => return WatchNews::Changed,
            Ok(Some(answer)) if answer.canceled() => {
                return WatchNews::Broken(WatchBroken::Canceled {
                    compact_revision: answer.compact_revision(),
                    reason: answer.cancel_reason().to_string(),
                });
            }
            // The "created" notice and progress notices carry no events.
            Ok(Some(_)) => continue,
            Ok(None) => return WatchNews::Broken(WatchBroken::Closed),
            Err(e) => return WatchNews::Broken(WatchBroken::Failed(e)),
        }
    }
}
