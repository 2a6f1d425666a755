//! What the identity writes to etcd and how to read it back: the key names,
//! the instance record, the order slots are probed in, and the listing the
//! `slots` command prints. Pure: no etcd client, no clock reads.

use crate::ids::{MachineId, SLOT_COUNT};
use crate::wire::messages::instance_id;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The etcd key names under one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    namespace: String,
}

impl Keys {
    pub fn new(namespace: &str) -> Keys {
        Keys {
            namespace: namespace.to_string(),
        }
    }

    /// `/{ns}/handoff/machine-ids/`
    pub fn slots_prefix(&self) -> String {
        format!("/{}/handoff/machine-ids/", self.namespace)
    }

    /// `/{ns}/handoff/machine-ids/{machine_id}`
    pub fn slot(&self, machine_id: MachineId) -> String {
        format!("{}{machine_id}", self.slots_prefix())
    }

    /// `/{ns}/handoff/id-floors/`: one persistent (not leased) key per slot
    /// that ever minted, outside the slots prefix so `slots` never lists it.
    pub fn id_floors_prefix(&self) -> String {
        format!("/{}/handoff/id-floors/", self.namespace)
    }

    /// `/{ns}/handoff/id-floors/{machine_id}`: the highest ID millisecond (since
    /// `id_epoch`) the slot's holders may have minted in, as a decimal string.
    pub fn id_floor(&self, machine_id: MachineId) -> String {
        format!("{}{machine_id}", self.id_floors_prefix())
    }

    /// `/{ns}/handoff/instances/`
    pub fn instances_prefix(&self) -> String {
        format!("/{}/handoff/instances/", self.namespace)
    }

    /// `/{ns}/handoff/instances/{lease_id as 16 hex digits}`
    pub fn instance(&self, lease_id: i64) -> String {
        format!("{}{}", self.instances_prefix(), instance_id(lease_id))
    }

    /// The machine ID a slot key names; `None` for anything else under the
    /// prefix (a stray key is not a slot).
    pub fn machine_id_of(&self, key: &str) -> Option<MachineId> {
        let rest = key.strip_prefix(&self.slots_prefix())?;
        if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) || rest.len() > 4 {
            return None;
        }
        MachineId::new(rest.parse::<i128>().ok()?).ok()
    }

    /// The lease a key under the instances prefix names.
    pub fn lease_of_instance(&self, key: &str) -> Option<i64> {
        let rest = key.strip_prefix(&self.instances_prefix())?;
        if rest.len() != 16 {
            return None;
        }
        u64::from_str_radix(rest, 16).ok().map(|v| v as i64)
    }
}

/// The JSON value of an instance key. `Default` is the empty record of an
/// etcd session that registers no instance (`slots`, a floor write).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRecord {
    pub host: String,
    pub pid: u32,
    /// `null` while the instance holds no slot (between the lease grant and
    /// the claim, or while every slot is taken).
    pub machine_id: Option<u16>,
    pub version: String,
    pub subjects: Vec<String>,
    /// RFC 3339, UTC.
    pub started_at: String,
}

/// `at` as RFC 3339 UTC with second precision, e.g. `2025-01-01T00:00:00Z`.
pub fn rfc3339(at: std::time::SystemTime) -> String {
    let at = OffsetDateTime::from(at);
    let at = at.replace_nanosecond(0).unwrap_or(at);
    at.format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// The slots to try for a lease, in order: `lease_id % 1021` first, then
/// upward, wrapping from 1020 to 0; every slot exactly once.
pub fn probe_order(lease_id: i64) -> impl Iterator<Item = MachineId> {
    let first = MachineId::preferred_for_lease(lease_id);
    std::iter::successors(Some(first), |m| Some(m.next_wrapping())).take(usize::from(SLOT_COUNT))
}

/// One line of `prefill-handoff slots`: a claimed slot with the instance that
/// holds it, or an instance without a slot (`machine_id: None`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotEntry {
    pub machine_id: Option<u16>,
    /// The lease as 16 hex digits (the instance ID).
    pub lease: String,
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub version: Option<String>,
    pub started_at: Option<String>,
    /// Seconds since `started_at`; `None` when it is unknown or unparsable.
    pub age_secs: Option<u64>,
}

/// A key read from etcd: its name, value and the lease it is attached to.
#[derive(Debug, Clone)]
pub struct StoredKey {
    pub key: String,
    pub value: Vec<u8>,
    pub lease: i64,
}

/// Joins the slot keys and the instance keys into the listing: claimed slots
/// in machine-ID order, then instances that hold no slot, by lease.
pub fn listing(
    keys: &Keys,
    slots: &[StoredKey],
    instances: &[StoredKey],
    now: std::time::SystemTime,
) -> Vec<SlotEntry> {
    let records: Vec<(i64, Option<InstanceRecord>)> = instances
        .iter()
        .filter_map(|k| {
            let lease = keys.lease_of_instance(&k.key)?;
            Some((lease, serde_json::from_slice(&k.value).ok()))
        })
        .collect();
    let record_of = |lease: i64| {
        records
            .iter()
            .find(|(l, _)| *l == lease)
            .and_then(|(_, r)| r.as_ref())
    };
    let entry = |machine_id: Option<u16>, lease: i64| {
        let record = record_of(lease);
        SlotEntry {
            machine_id,
            lease: instance_id(lease),
            host: record.map(|r| r.host.clone()),
            pid: record.map(|r| r.pid),
            version: record.map(|r| r.version.clone()),
            started_at: record.map(|r| r.started_at.clone()),
            age_secs: record.and_then(|r| age_secs(&r.started_at, now)),
        }
    };

    let mut claimed: Vec<(MachineId, i64)> = slots
        .iter()
        .filter_map(|k| Some((keys.machine_id_of(&k.key)?, slot_lease(k))))
        .collect();
    claimed.sort();
    let mut out: Vec<SlotEntry> = claimed
        .iter()
        .map(|(m, lease)| entry(Some(m.get()), *lease))
        .collect();

    let mut slotless: Vec<i64> = records
        .iter()
        .map(|(lease, _)| *lease)
        .filter(|lease| !claimed.iter().any(|(_, l)| l == lease))
        .collect();
    slotless.sort();
    out.extend(slotless.into_iter().map(|lease| entry(None, lease)));
    out
}

/// The lease a slot key belongs to: the lease it is attached to, else the
/// lease its value names (a slot key written without a lease).
fn slot_lease(key: &StoredKey) -> i64 {
    if key.lease != 0 {
        return key.lease;
    }
    std::str::from_utf8(&key.value)
        .ok()
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .map_or(0, |v| v as i64)
}

fn age_secs(started_at: &str, now: std::time::SystemTime) -> Option<u64> {
    let started = OffsetDateTime::parse(started_at, &Rfc3339).ok()?;
    let now = OffsetDateTime::from(now);
    Some((now - started).whole_seconds().max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    fn m(v: u16) -> MachineId {
        MachineId::new(i128::from(v)).unwrap()
    }

    #[test]
    fn key_names_follow_the_contract() {
        let keys = Keys::new("llm");
        assert_eq!(keys.slot(m(7)), "/llm/handoff/machine-ids/7");
        assert_eq!(keys.id_floor(m(7)), "/llm/handoff/id-floors/7");
        assert!(!keys.id_floor(m(7)).starts_with(&keys.slots_prefix()));
        assert_eq!(keys.machine_id_of(&keys.id_floor(m(7))), None);
        assert_eq!(
            keys.instance(0x1a2b),
            "/llm/handoff/instances/0000000000001a2b"
        );
        assert_eq!(
            keys.machine_id_of("/llm/handoff/machine-ids/1020"),
            Some(m(1020))
        );
        for stray in [
            "/llm/handoff/machine-ids/1021",
            "/llm/handoff/machine-ids/",
            "/llm/handoff/machine-ids/x",
            "/llm/handoff/machine-ids/+1",
            "/other/handoff/machine-ids/3",
        ] {
            assert_eq!(keys.machine_id_of(stray), None, "{stray}");
        }
        assert_eq!(
            keys.lease_of_instance("/llm/handoff/instances/0000000000001a2b"),
            Some(0x1a2b)
        );
        assert_eq!(keys.lease_of_instance("/llm/handoff/instances/1a2b"), None);
    }

    #[test]
    fn probing_starts_at_lease_mod_1021_and_wraps_upward_once() {
        let order: Vec<u16> = probe_order(1021 * 5 + 1019).map(MachineId::get).collect();
        assert_eq!(order.len(), 1021);
        assert_eq!(&order[..4], &[1019, 1020, 0, 1]);
        assert_eq!(order[1020], 1018);
        let mut sorted = order.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 1021, "every slot exactly once");
    }

    #[test]
    fn started_at_is_rfc3339_utc_in_seconds() {
        let at = UNIX_EPOCH + Duration::from_millis(1_735_689_600_123);
        assert_eq!(rfc3339(at), "2025-01-01T00:00:00Z");
    }

    fn record(machine_id: Option<u16>, started_at: &str) -> Vec<u8> {
        serde_json::to_vec(&InstanceRecord {
            host: "h".into(),
            pid: 42,
            machine_id,
            version: "0.1.0".into(),
            subjects: vec![],
            started_at: started_at.into(),
        })
        .unwrap()
    }

    #[test]
    fn listing_joins_slots_with_instances_and_lists_slotless_instances() {
        let keys = Keys::new("llm");
        let stored = |key: String, value: Vec<u8>, lease: i64| StoredKey { key, value, lease };
        let slots = vec![
            stored(keys.slot(m(9)), b"00000000000000bb".to_vec(), 0xbb),
            stored(keys.slot(m(3)), b"00000000000000aa".to_vec(), 0xaa),
            stored(keys.slot(m(5)), b"00000000000000dd".to_vec(), 0),
            stored(keys.slots_prefix() + "junk", b"x".to_vec(), 1),
        ];
        let instances = vec![
            stored(
                keys.instance(0xaa),
                record(Some(3), "2025-01-01T00:00:00Z"),
                0xaa,
            ),
            stored(keys.instance(0xbb), b"not json".to_vec(), 0xbb),
            stored(
                keys.instance(0xcc),
                record(None, "2025-01-01T00:01:00Z"),
                0xcc,
            ),
        ];
        let now = UNIX_EPOCH + Duration::from_secs(1_735_689_600 + 90);
        let list = listing(&keys, &slots, &instances, now);
        let summary: Vec<_> = list
            .iter()
            .map(|e| (e.machine_id, e.lease.as_str(), e.age_secs, e.pid))
            .collect();
        assert_eq!(
            summary,
            vec![
                (Some(3), "00000000000000aa", Some(90), Some(42)),
                (Some(5), "00000000000000dd", None, None),
                (Some(9), "00000000000000bb", None, None),
                (None, "00000000000000cc", Some(30), Some(42)),
            ]
        );
        assert!(listing(&keys, &[], &[], SystemTime::now()).is_empty());
    }
}
