//! Reading the slot registry back from etcd, for `prefill-handoff slots`.

use super::LeaseError;
use super::claim::{self, Settings};
use super::registry::{InstanceRecord, Keys, SlotEntry, StoredKey, listing};
use crate::config::Config;
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
