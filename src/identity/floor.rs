//! The slot's ID floor in etcd: `/{ns}/handoff/id-floors/{machine_id}`, a
//! persistent (not leased) key holding the highest ID millisecond (since
//! `id_epoch`) the slot's holders may have minted in, as a decimal string.
//!
//! Why: the next holder of a slot may run on a node whose clock is behind,
//! and would mint the IDs the previous holder minted in its last moments. So
//! a holder reserves before it mints: it mints only up to the floor it has
//! written, and a new holder starts above the floor it read.
//!
//! - Claim: the claim transaction reads the floor (atomically with taking the
//!   slot); then the holder writes `max(floor, own high water, now) + TTL`.
//! - Every TTL/3 after its last successful write, on a schedule of its own
//!   (beside the keepalive, whatever that does): the holder writes
//!   `max(now, last minted) + TTL`, never less than what it holds, and sends
//!   the write again until etcd answers (see "Timing budget" below). Until
//!   then minting stays bounded by the reservation already held; a refused
//!   write means the slot moved.
//! - Shutdown, after fencing: the exact floor, the last minted millisecond, so
//!   the next holder is not held back by a TTL-long reservation.
//!
//! Every write is a transaction conditioned on the slot key still being
//! attached to the writer's lease: a late write from a holder that lost its
//! slot can never move the floor of the next one.

//!
//! # Timing budget (why a leader election is invisible to clients)
//!
//! With the 5 s TTL of the cluster test (`tests/cluster_etcd.rs`), each
//! successful write reserves 5 s ahead and the next one is due 1.67 s (TTL/3)
//! later, so when an etcd leader dies the reservation has at least
//! 5 - 1.67 = 3.33 s left. etcd needs its election timeout (1 s by default,
//! randomized up to 2 s) to notice, then a vote: seconds in all
//! (`docs/performance.md`). A write sent to a member without a
//! leader is not refused: etcd drops the proposal and holds the request
//! until its own request timeout (7 s by default), and one sent to the dead
//! member fails at once. So a renewal never waits on a single request: it
//! sends a try every [`TRY_EVERY`] ([`AFTER_FAILURE`] after a try that
//! failed) while earlier ones still wait, each bounded by
//! `etcd.request_timeout_ms` (2 s), and takes the first answer. Once a new
//! leader is elected, a renewal gets through within about 0.4 s plus one
//! commit (waiting out one request's 2 s timeout, then retrying, would run
//! out of reservation in such an election). Budget: an election of up
//! to about 3.33 - 0.5 = 2.8 s after the kill costs clients nothing at TTL
//! 5 s; at the default TTL of 10 s, 6.67 - 0.5 = 6.1 s. Every try of one
//! renewal writes the same value, so their order in etcd does not matter.
//!
//! With slower elections (the cluster test's etcd run with
//! `ETCD_ELECTION_TIMEOUT=1500 ETCD_HEARTBEAT_INTERVAL=150`) this schedule
//! keeps every client's ID (`docs/performance.md`).

use super::etcd::{EtcdError, LeaseError, Settings};
use super::registry::Keys;
use super::{Identity, Reservation};
use crate::ids::MachineId;
use crate::wire::messages::instance_id;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};
use futures::stream::{FuturesUnordered, StreamExt};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How often a renewal without an answer is sent again, beside the tries
/// still waiting (see "Timing budget" above).
const TRY_EVERY: Duration = Duration::from_millis(400);
/// How soon a try follows one that failed (a dead member refuses the
/// connection at once).
const AFTER_FAILURE: Duration = Duration::from_millis(100);
/// Tries of one renewal waiting at once. Each ends by
/// `etcd.request_timeout_ms` (2 s by default: about 5 tries at
/// [`TRY_EVERY`]). The cap bounds what an etcd slower than [`TRY_EVERY`] per
/// write gets from a holder:
/// at most 5 floor writes at once instead of 1, once every TTL/3.
const MAX_TRIES_WAITING: usize = 5;

/// The read the claim transaction carries for `machine_id`'s floor.
pub(super) fn read_op(keys: &Keys, machine_id: MachineId) -> TxnOp {
    TxnOp::get(keys.id_floor(machine_id), None)
}

/// The floor the claim transaction read; `None` when the slot has none yet
/// (or its value is not a decimal number of milliseconds: logged and
/// overwritten, since only an operator writes anything else there).
pub(super) fn previous(answer: &TxnResponse, keys: &Keys, machine_id: MachineId) -> Option<u64> {
    let value = answer.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    })?;
    let floor = parse(&value);
    if floor.is_none() {
        warn!(
            key = %keys.id_floor(machine_id),
            value = %String::from_utf8_lossy(&value),
            "the ID floor is not a decimal number of milliseconds; ignoring and overwriting it"
        );
    }
    floor
}

/// A floor value: decimal ASCII digits, nothing else.
pub(super) fn parse(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 20 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

fn window_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

/// Writes the first reservation of a freshly claimed slot: from above the
/// previous floor (and this process's own high water) up to that or the
/// clock, whichever is later, plus one TTL.
pub(super) async fn reserve_on_claim(
    settings: &Settings,
    client: &Client,
    lease_id: i64,
    machine_id: MachineId,
    previous: Option<u64>,
    identity: &Identity,
    ttl: Duration,
) -> Result<Reservation, LeaseError> {
    let start = previous
        .max(identity.high_water_ms())
        .unwrap_or(0)
        .max(identity.now_ms());
    let until_ms = start.saturating_add(window_ms(ttl));
    write(settings, client, lease_id, machine_id, until_ms).await?;
    debug!(
        machine_id = machine_id.get(),
        previous_floor_ms = previous,
        reserved_until_ms = until_ms,
        "ID floor reserved"
    );
    Ok(Reservation {
        above_ms: previous,
        until_ms,
    })
}

/// Why a floor write did not happen.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    /// etcd answered: the slot key is no longer attached to the writer's
    /// lease. The slot is lost (or about to be claimed by another worker).
    #[error("{0}")]
    SlotMoved(LeaseError),
    /// No answer (unreachable, timed out, no leader): try again.
    #[error("{0}")]
    Etcd(LeaseError),
}

impl From<WriteError> for LeaseError {
    fn from(e: WriteError) -> LeaseError {
        match e {
            WriteError::SlotMoved(e) | WriteError::Etcd(e) => e,
        }
    }
}

/// The holder of a slot, as a floor renewal needs it (borrowed apart from
/// the keepalive, which runs at the same time).
#[derive(Clone, Copy)]
pub(super) struct Holder<'a> {
    pub client: &'a Client,
    pub lease_id: i64,
    pub machine_id: MachineId,
    pub ttl: Duration,
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Renewal {
    /// Written, or not attempted (fenced) or failed for want of an answer:
    /// minting stays bounded by the reservation held.
    Held,
    /// etcd refused the write: the slot key is no longer ours.
    SlotMoved,
}

/// The time from one successful renewal to the next: a third of the TTL, like
/// the keepalive, so a reservation of one TTL has two thirds left when the
/// next renewal starts.
pub(super) fn renewal_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// Renews the reservation on its own schedule until etcd refuses a write
/// (the slot moved): first at `first`, then [`renewal_interval`] after each
/// successful write. Independent of the keepalive: a successful write proves
/// by itself that the slot key was still attached to our lease.
pub(super) async fn keep_renewing(
    settings: &Settings,
    holder: Holder<'_>,
    identity: &Identity,
    first: Instant,
) {
    let mut due = first;
    loop {
        tokio::time::sleep_until(due.into()).await;
        if renew(settings, holder, identity).await == Renewal::SlotMoved {
            return;
        }
        due = Instant::now() + renewal_interval(holder.ttl);
    }
}

/// Extends the reservation: sends the write, and again every [`TRY_EVERY`]
/// while no try has an answer, until one is written or refused. Without an
/// answer it only logs (once per `etcd.request_timeout_ms`): minting stays
/// bounded by the reservation already held.
pub(super) async fn renew(settings: &Settings, holder: Holder<'_>, identity: &Identity) -> Renewal {
    let Some(until_ms) = identity.renewal_floor(window_ms(holder.ttl)) else {
        return Renewal::Held;
    };
    let try_once = || {
        write_once(
            settings,
            holder.client,
            holder.lease_id,
            holder.machine_id,
            until_ms,
        )
    };
    let mut tries = FuturesUnordered::new();
    let started = Instant::now();
    let mut sent = 0u32;
    let mut next_try = started;
    let mut next_warning = started + settings.request_timeout();
    let mut last_error = None;
    loop {
        tokio::select! {
            biased;
            answer = tries.next(), if !tries.is_empty() => match answer {
                Some(Ok(())) => {
                    identity.reserve(until_ms);
                    debug!(
                        machine_id = holder.machine_id.get(),
                        reserved_until_ms = until_ms,
                        tries = sent,
                        took_ms = started.elapsed().as_millis(),
                        "ID floor renewed"
                    );
                    return Renewal::Held;
                }
                Some(Err(WriteError::SlotMoved(e))) => {
                    warn!(
                        lease = %instance_id(holder.lease_id),
                        machine_id = holder.machine_id.get(),
                        error = %e,
                        "the ID floor write was refused: the slot is no longer held by this lease"
                    );
                    return Renewal::SlotMoved;
                }
                Some(Err(WriteError::Etcd(e))) => {
                    debug!(error = %e, "an ID floor write failed; sending it again");
                    next_try = next_try.min(Instant::now() + AFTER_FAILURE);
                    last_error = Some(e);
                }
                None => {}
            },
            _ = tokio::time::sleep_until(next_try.into()), if tries.len() < MAX_TRIES_WAITING => {
                tries.push(try_once());
                sent += 1;
                next_try = Instant::now() + TRY_EVERY;
            }
            _ = tokio::time::sleep_until(next_warning.into()) => {
                warn!(
                    lease = %instance_id(holder.lease_id),
                    machine_id = holder.machine_id.get(),
                    error = last_error.as_ref().map(tracing::field::display),
                    reserved_for_ms = identity.reserved_for_ms(),
                    "cannot renew the ID floor yet; still trying (minting stays bounded by the reservation held)"
                );
                next_warning = Instant::now() + settings.request_timeout();
            }
        }
    }
}

/// On shutdown, after the identity is fenced: lowers the floor to the last
/// millisecond minted, so the next holder starts right above it. Without a
/// known last millisecond the reservation stays (safe, only later).
pub(super) async fn settle(settings: &Settings, holder: Holder<'_>, identity: &Identity) {
    let Some(last_ms) = identity.high_water_ms() else {
        return;
    };
    match write(
        settings,
        holder.client,
        holder.lease_id,
        holder.machine_id,
        last_ms,
    )
    .await
    {
        Ok(()) => info!(
            machine_id = holder.machine_id.get(),
            floor_ms = last_ms,
            "ID floor set to the last minted millisecond"
        ),
        Err(e) => warn!(
            machine_id = holder.machine_id.get(),
            error = %e,
            "cannot lower the ID floor; the next holder starts above the reservation"
        ),
    }
}

/// The floor write: put the floor, provided the slot key is still attached
/// to `lease_id`.
fn floor_txn(keys: &Keys, lease_id: i64, machine_id: MachineId, floor_ms: u64) -> Txn {
    Txn::new()
        .when([Compare::lease(
            keys.slot(machine_id),
            CompareOp::Equal,
            lease_id,
        )])
        .and_then([TxnOp::put(
            keys.id_floor(machine_id),
            floor_ms.to_string(),
            None,
        )])
}

/// Puts the floor, provided the slot key is still attached to `lease_id`;
/// sent again at once to another member when a try fails
/// (`Settings::failing_over`).
pub(super) async fn write(
    settings: &Settings,
    client: &Client,
    lease_id: i64,
    machine_id: MachineId,
    floor_ms: u64,
) -> Result<(), WriteError> {
    let txn = floor_txn(&settings.keys, lease_id, machine_id, floor_ms);
    let answer = settings
        .failing_over("writing the ID floor", || {
            let mut kv = client.kv_client();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
        .map_err(WriteError::Etcd)?;
    outcome(&settings.keys, lease_id, machine_id, &answer)
}

/// One try of the floor write, bounded by `etcd.request_timeout_ms`.
async fn write_once(
    settings: &Settings,
    client: &Client,
    lease_id: i64,
    machine_id: MachineId,
    floor_ms: u64,
) -> Result<(), WriteError> {
    let txn = floor_txn(&settings.keys, lease_id, machine_id, floor_ms);
    let answer = settings
        .bounded("writing the ID floor", client.kv_client().txn(txn))
        .await
        .map_err(WriteError::Etcd)?;
    outcome(&settings.keys, lease_id, machine_id, &answer)
}

/// Written, or refused because the slot key is no longer ours.
fn outcome(
    keys: &Keys,
    lease_id: i64,
    machine_id: MachineId,
    answer: &TxnResponse,
) -> Result<(), WriteError> {
    if answer.succeeded() {
        Ok(())
    } else {
        Err(WriteError::SlotMoved(
            EtcdError::FloorNotWritten {
                floor: keys.id_floor(machine_id).to_string(),
                slot: keys.slot(machine_id).to_string(),
                lease: instance_id(lease_id).to_string(),
            }
            .into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn floor_values_are_plain_decimal_milliseconds() {
        let cases: [(&[u8], Option<u64>); 9] = [
            (b"0", Some(0)),
            (b"123456789", Some(123_456_789)),
            (b"18446744073709551615", Some(u64::MAX)),
            (b"18446744073709551616", None),
            (b"", None),
            (b"-1", None),
            (b"+1", None),
            (b" 12", None),
            (b"12ms", None),
        ];
        for (value, expected) in cases {
            assert_eq!(
                parse(value),
                expected,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }
}
