//! Getting a slot: connect to etcd, grant a lease, register the instance,
//! claim the first free machine-ID slot from `lease_id % 1021` upward with
//! one transaction per slot, which also reads the slot's ID floor; then
//! reserve IDs above it (`floor.rs`). Also the lease revoke used on the way
//! out.

use super::etcd::{EtcdError, LeaseError, Settings};
use super::floor;
use super::keepalive::{Beat, KeepAlive};
use super::registry::probe_order;
use super::{Identity, Reservation};
use crate::config::redact_urls;
use crate::ids::MachineId;
use crate::wire::messages::instance_id;
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// A lease with a claimed slot, registered and being kept alive.
pub(super) struct Claimed {
    pub lease_id: i64,
    pub machine_id: MachineId,
    /// The TTL the server granted.
    pub ttl: Duration,
    pub valid_until: Instant,
    /// The revision of the claim transaction: the slot key is ours as of it.
    pub revision: i64,
    /// The ID milliseconds this holder may mint in (its floor in etcd).
    pub reservation: Reservation,
    pub client: Client,
    pub keepalive: KeepAlive,
}

impl Claimed {
    /// The holder as the floor's writes need it.
    pub(super) fn holder(&self) -> floor::Holder<'_> {
        floor::Holder {
            client: &self.client,
            lease_id: self.lease_id,
            machine_id: self.machine_id,
            ttl: self.ttl,
        }
    }
}

/// Connects to the configured endpoints with the configured credentials.
pub(super) async fn connect(settings: &Settings) -> Result<Client, LeaseError> {
    let endpoints = settings.endpoints();
    if endpoints.is_empty() {
        return Err(EtcdError::NoEndpoints.into());
    }
    // HTTP/2 pings no more often than etcd's --grpc-keepalive-min-time
    // (5 s by default): a client pinging every second while its requests
    // wait on a busy etcd is sent GOAWAY "too_many_pings", and every request
    // on that connection fails (seen with 1021 identities claiming at once).
    let mut options = ConnectOptions::new()
        .with_connect_timeout(settings.connect_timeout())
        .with_timeout(settings.request_timeout())
        .with_keep_alive(Duration::from_secs(10), settings.request_timeout())
        .with_keep_alive_while_idle(true);
    // Set together or not at all: the configuration refuses one alone.
    if let (Some(user), Some(password)) = (&settings.etcd.user, &settings.etcd.password) {
        options = options.with_user(user.clone(), password.clone());
    }
    if settings.etcd.tls_enabled() {
        options = etcd_tls(options, settings, &endpoints).await?;
    }
    // With credentials the client authenticates while connecting.
    let bound = settings.connect_timeout() + settings.request_timeout();
    match tokio::time::timeout(bound, Client::connect(&endpoints, Some(options))).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(error)) => Err(EtcdError::Connect {
            endpoints: redact_urls(&settings.etcd.endpoints),
            error,
        }
        .into()),
        Err(_) => Err(EtcdError::ConnectTimeout {
            endpoints: redact_urls(&settings.etcd.endpoints),
            ms: bound.as_millis(),
        }
        .into()),
    }
}

/// `etcd.tls.*`: the CA (instead of the system roots) and the client
/// certificate, for `https://` endpoints. When no endpoint completes a TLS
/// handshake, the first one's reason is the error (tonic would only say
/// "connection closed").
async fn etcd_tls(
    options: ConnectOptions,
    settings: &Settings,
    endpoints: &[String],
) -> Result<ConnectOptions, LeaseError> {
    use crate::security::{Section, TlsFiles, pem::Material, probe};
    let etcd = &settings.etcd;
    let material = Material::load(TlsFiles::etcd(etcd))?;
    let config = material.client_config()?;
    let sent_cert = etcd.tls.cert_file.is_some();
    let mut refused = None;
    for endpoint in endpoints {
        match probe::handshake(endpoint, config.clone(), Section::Etcd, sent_cert).await {
            Some(why) => {
                refused.get_or_insert(why);
            }
            None => {
                refused = None;
                break;
            }
        }
    }
    if let Some(why) = refused {
        return Err(EtcdError::Tls {
            endpoints: crate::config::redact_urls(&etcd.endpoints),
            why,
        }
        .into());
    }
    Ok(options.with_tls(material.etcd_options()))
}

/// Grants a lease, registers the instance and claims a slot. On failure the
/// lease is revoked (best effort) so nothing half-registered stays behind.
pub(super) async fn establish(
    settings: &Settings,
    identity: &Identity,
) -> Result<Claimed, LeaseError> {
    let client = connect(settings).await?;
    let sent = Instant::now();
    let grant = settings
        .bounded(
            "granting a lease",
            client.lease_client().grant(settings.ttl_secs, None),
        )
        .await?;
    let lease_id = grant.id();
    if grant.ttl() <= 0 {
        return Err(EtcdError::NonPositiveTtl {
            lease: instance_id(lease_id).to_string(),
            ttl: grant.ttl(),
        }
        .into());
    }
    let ttl = Duration::from_secs(grant.ttl().unsigned_abs());
    let Some(valid_until) = sent.checked_add(ttl) else {
        return Err(EtcdError::UnusableTtl {
            lease: instance_id(lease_id).to_string(),
            ttl: grant.ttl(),
        }
        .into());
    };
    identity.set_lease(lease_id);
    info!(lease = %instance_id(lease_id), ttl_secs = grant.ttl(), "etcd lease granted");

    let mut claim = Claim {
        settings,
        client: client.clone(),
        lease_id,
        ttl,
        valid_until,
        keepalive: KeepAlive::new(client.clone(), lease_id),
    };
    let claimed = match claim.run().await {
        Ok((machine_id, revision, previous_floor)) => floor::reserve_on_claim(
            settings,
            &client,
            lease_id,
            machine_id,
            previous_floor,
            identity,
            ttl,
        )
        .await
        .map(|reservation| (machine_id, revision, reservation)),
        Err(e) => Err(e),
    };
    match claimed {
        Ok((machine_id, revision, reservation)) => Ok(Claimed {
            lease_id,
            machine_id,
            ttl,
            valid_until: claim.valid_until,
            revision,
            reservation,
            client,
            keepalive: claim.keepalive,
        }),
        Err(e) => {
            revoke(settings, &client, lease_id).await;
            Err(e)
        }
    }
}

struct Claim<'a> {
    settings: &'a Settings,
    client: Client,
    lease_id: i64,
    ttl: Duration,
    valid_until: Instant,
    keepalive: KeepAlive,
}

impl Claim<'_> {
    /// The slot claimed, the claim's revision and the slot's ID floor as the
    /// claim found it.
    async fn run(&mut self) -> Result<(MachineId, i64, Option<u64>), LeaseError> {
        let keys = &self.settings.keys;
        let hex = instance_id(self.lease_id);
        let lease_id = self.lease_id;
        let leased = || Some(PutOptions::new().with_lease(lease_id));
        let instance_key = keys.instance(lease_id);
        let settings = self.settings;
        let record = |machine_id: Option<MachineId>| {
            let mut record = settings.record.clone();
            record.machine_id = machine_id.map(MachineId::get);
            serde_json::to_vec(&record).unwrap_or_default()
        };

        // Registered first without a slot, so an instance that cannot get
        // one is still visible in `slots`.
        let mut kv = self.client.kv_client();
        self.settings
            .bounded(
                "registering the instance key",
                kv.put(instance_key.clone(), record(None), leased()),
            )
            .await?;

        // One read to skip slots that are visibly taken; the transaction
        // below stays the authority for the ones that look free.
        let taken = self.taken_slots().await?;
        for machine_id in probe_order(self.lease_id).filter(|m| !taken.contains(m)) {
            self.keep_alive_if_due().await?;
            let slot_key = keys.slot(machine_id);
            let txn = Txn::new()
                .when([Compare::create_revision(
                    slot_key.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([
                    TxnOp::put(slot_key.clone(), hex.clone(), leased()),
                    TxnOp::put(instance_key.clone(), record(Some(machine_id)), leased()),
                    floor::read_op(keys, machine_id),
                ]);
            let answer = self
                .settings
                .bounded("claiming a machine-ID slot", kv.txn(txn))
                .await?;
            if answer.succeeded() {
                let revision = answer.header().map_or(0, |h| h.revision());
                let previous_floor = floor::previous(&answer, keys, machine_id);
                return Ok((machine_id, revision, previous_floor));
            }
            debug!(lease = %hex, slot = %slot_key, "slot taken meanwhile; trying the next");
        }
        Err(LeaseError::SlotsExhausted {
            prefix: keys.slots_prefix(),
        })
    }

    async fn taken_slots(&self) -> Result<HashSet<MachineId>, LeaseError> {
        let keys = &self.settings.keys;
        let answer = self
            .settings
            .bounded(
                "reading the machine-ID slots",
                self.client.kv_client().get(
                    keys.slots_prefix(),
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                ),
            )
            .await?;
        Ok(answer
            .kvs()
            .iter()
            .filter_map(|kv| keys.machine_id_of(kv.key_str().ok()?))
            .collect())
    }

    /// Probing many slots can take a while: keep the lease alive meanwhile
    /// on the same TTL/3 rhythm as afterwards.
    async fn keep_alive_if_due(&mut self) -> Result<(), LeaseError> {
        let last_refresh = self.valid_until - self.ttl;
        if Instant::now() < last_refresh + self.ttl / 3 {
            return Ok(());
        }
        let deadline = (Instant::now() + self.settings.request_timeout()).min(self.valid_until);
        match self.keepalive.beat(deadline).await {
            Ok(Beat::Alive { valid_until }) => {
                self.valid_until = valid_until;
                Ok(())
            }
            Ok(Beat::Gone) => Err(EtcdError::ExpiredWhileClaiming {
                lease: instance_id(self.lease_id).to_string(),
            }
            .into()),
            Err(error) if Instant::now() >= self.valid_until => Err(EtcdError::MayHaveExpired {
                lease: instance_id(self.lease_id).to_string(),
                error,
            }
            .into()),
            Err(_) => Ok(()),
        }
    }
}

/// Revokes a lease so its slot and instance keys vanish at once. Best
/// effort and bounded: a dead etcd lets the lease expire by itself. True when
/// the lease is gone (revoked now, or already expired).
///
/// An error answer is tried again (after a fifth of a second, each pause
/// twice the last, up to a second) until
/// `etcd.request_timeout_ms` has passed: an etcd busy with a fleet's
/// shutdown at once (a thousand floor writes and revokes) refused some
/// revokes outright, and their slots then stayed taken for the whole TTL.
pub(super) async fn revoke(settings: &Settings, client: &Client, lease_id: i64) -> bool {
    let hex = instance_id(lease_id);
    let mut leases = client.lease_client();
    let deadline = tokio::time::Instant::now() + settings.request_timeout();
    let mut pause = Duration::from_millis(200);
    let mut tries = 0u32;
    loop {
        tries += 1;
        let error = match tokio::time::timeout_at(deadline, leases.revoke(lease_id)).await {
            Ok(Ok(_)) => {
                info!(lease = %hex, tries, "etcd lease revoked");
                return true;
            }
            Ok(Err(etcd_client::Error::GRpcStatus(status)))
                if status.message().contains("lease not found") =>
            {
                debug!(lease = %hex, "lease already gone; nothing to revoke");
                return true;
            }
            Ok(Err(e)) => e,
            Err(_) => {
                warn!(lease = %hex, tries, "etcd did not answer the revoke in time; the lease expires after its TTL");
                return false;
            }
        };
        if tokio::time::Instant::now() + pause >= deadline {
            warn!(lease = %hex, tries, error = %error, "could not revoke the lease; it expires after its TTL");
            return false;
        }
        debug!(lease = %hex, tries, error = %error, "revoke refused; trying again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}
