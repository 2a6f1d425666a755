//! etcd as seen from outside a held slot: the slot registry read back, for
//! `prefill-handoff slots`, and a floor write as a given lease, for a test.

use super::claim;
use super::etcd::{LeaseError, Settings};
use super::floor;
use super::registry::{InstanceRecord, Keys, SlotEntry, StoredKey, listing};
use crate::config::Config;
use crate::ids::MachineId;
use etcd_client::{Client, GetOptions};
use std::time::SystemTime;

/// The claimed slots (with the instance holding each) and the instances
/// without a slot, as they are in etcd now.
pub async fn read_slots(config: &Config) -> Result<Vec<SlotEntry>, LeaseError> {
    let keys = Keys::new(&config.namespace);
    let settings = Settings {
        etcd: config.etcd.clone(),
        keys: keys.clone(),
        ttl_secs: 0,
        record: InstanceRecord::default(),
    };
    let client = claim::connect(&settings).await?;
    // Both prefixes at one revision, so a slot and its instance agree.
    let (slots, revision) = read_prefix(&settings, &client, keys.slots_prefix(), 0).await?;
    let (instances, _) = read_prefix(&settings, &client, keys.instances_prefix(), revision).await?;
    Ok(listing(&keys, &slots, &instances, SystemTime::now()))
}

async fn read_prefix(
    settings: &Settings,
    client: &Client,
    prefix: String,
    revision: i64,
) -> Result<(Vec<StoredKey>, i64), LeaseError> {
    let answer = settings
        .bounded(
            "reading the slot registry",
            client.kv_client().get(
                prefix,
                Some(GetOptions::new().with_prefix().with_revision(revision)),
            ),
        )
        .await?;
    let keys = answer
        .kvs()
        .iter()
        .map(|kv| StoredKey {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value: kv.value().to_vec(),
            lease: kv.lease(),
        })
        .collect();
    Ok((keys, answer.header().map_or(0, |h| h.revision())))
}

/// One floor write as `lease_id`, exactly as a holder renews its
/// reservation: for the test that a former holder's late write is refused
/// once the slot moved (the rule every reservation's safety rests on).
#[doc(hidden)]
pub async fn write_floor_as(
    config: &Config,
    lease_id: i64,
    machine_id: MachineId,
    floor_ms: u64,
) -> Result<(), LeaseError> {
    let settings = Settings {
        etcd: config.etcd.clone(),
        keys: Keys::new(&config.namespace),
        ttl_secs: 1,
        record: InstanceRecord::default(),
    };
    let client = claim::connect(&settings).await?;
    floor::write(&settings, &client, lease_id, machine_id, floor_ms)
        .await
        .map_err(LeaseError::from)
}
