//! `setup`: the `{NS}_PREFILL` work-queue stream, the `{NS}_GEN` stream and the
//! shared durable pull consumer, created when missing and checked when present.
//!
//! - `wanted.rs`: what the configuration asks for (pure).
//! - `diff.rs`: what differs on the server, and whether it can change in place (pure).
//! - here: [`ensure`], the only part that talks to the server.
//!
//! Running it twice provably changes nothing the second time: the second run
//! finds no difference and sends no update.

mod diff;
mod wanted;

pub use diff::{Change, Mismatch, Report, consumer_mismatches, stream_mismatches};
pub use wanted::{Wanted, WantedError, consumer, duplicate_window, gen_stream, prefill_stream};

use crate::config::Config;
use async_nats::jetstream::{
    self,
    consumer::{FromConsumer, pull},
    stream,
};
use std::fmt;
use std::time::Duration;

/// What can go wrong setting up or opening the durable mode's objects.
#[derive(Debug, thiserror::Error)]
pub enum JetStreamError {
    /// The configuration asks for objects that cannot work (exit 2).
    #[error(transparent)]
    Wanted(#[from] WantedError),
    /// A JetStream API request failed (server unreachable, permission, ...).
    #[error("JetStream: {0}")]
    Api(String),
    /// A stream or consumer exists with settings that cannot be changed in place.
    #[error("{0}")]
    Incompatible(String),
    /// The stream or consumer does not exist and may not be created.
    #[error("{0}")]
    Missing(String),
}

impl From<crate::transport::jetstream::OpenError> for JetStreamError {
    fn from(e: crate::transport::jetstream::OpenError) -> JetStreamError {
        use crate::transport::jetstream::OpenError;
        match e {
            OpenError::Api(why) => JetStreamError::Api(why),
            OpenError::Missing(why) => JetStreamError::Missing(why),
        }
    }
}

/// Which objects [`ensure`] manages. The GEN stream only when decode jobs are
/// published into it (`jetstream.gen_is_stream`).
fn manages_gen(config: &Config) -> bool {
    config.jetstream.gen_is_stream
}

/// Creates what is missing and updates what differs in a way the server can
/// change in place. A difference it cannot change (retention, storage, ack
/// policy, ...) is an error that names the object, the field and the way out;
/// nothing is deleted.
pub async fn ensure(js: &jetstream::Context, config: &Config) -> Result<Report, JetStreamError> {
    let wanted = Wanted::from_config(config)?;
    let mut objects = Vec::new();
    let label = |kind: &str, name: &str| format!("{kind} {name}");
    let change = ensure_stream(js, &wanted.prefill).await?;
    objects.push((label("stream", &wanted.prefill.name), change));
    if manages_gen(config) {
        let change = ensure_stream(js, &wanted.gen_jobs).await?;
        objects.push((label("stream", &wanted.gen_jobs.name), change));
    }
    let change = ensure_consumer(js, &wanted.prefill.name, &wanted.consumer).await?;
    let name = wanted.consumer.durable_name.clone().unwrap_or_default();
    objects.push((format!("consumer {}/{name}", wanted.prefill.name), change));
    Ok(Report { objects })
}

fn api_error(what: String, e: impl fmt::Display) -> JetStreamError {
    JetStreamError::Api(format!("{what}: {e}"))
}

/// A refused create or update of a replicated stream: the usual cause is a
/// server that is not part of a cluster with enough JetStream servers (a
/// single server refuses any replicas above 1), so the message says so.
fn replicas_error(what: String, want: &stream::Config, e: impl fmt::Display) -> JetStreamError {
    if want.num_replicas <= 1 {
        return api_error(what, e);
    }
    JetStreamError::Api(format!(
        "{what} with {} replicas: {e}; replicas above 1 need a NATS cluster with at least {} JetStream servers. Either set jetstream.replicas to what the cluster holds, or add servers and run setup again",
        want.num_replicas, want.num_replicas
    ))
}

async fn ensure_stream(
    js: &jetstream::Context,
    want: &stream::Config,
) -> Result<Change, JetStreamError> {
    use jetstream::context::GetStreamErrorKind;
    let name = &want.name;
    let have = match js.get_stream(name).await {
        Ok(mut stream) => stream
            .info()
            .await
            .map_err(|e| api_error(format!("reading stream {name}"), e))?
            .config
            .clone(),
        Err(e) if matches!(e.kind(), GetStreamErrorKind::JetStream(ref api) if api.code() == 404) =>
        {
            js.create_stream(want.clone())
                .await
                .map_err(|e| replicas_error(format!("creating stream {name}"), want, e))?;
            return Ok(Change::Created);
        }
        Err(e) => return Err(api_error(format!("looking up stream {name}"), e)),
    };
    let mismatches = stream_mismatches(&have, want);
    if mismatches.is_empty() {
        return Ok(Change::Unchanged);
    }
    if let Some(fixed) = mismatches.iter().find(|m| !m.updatable) {
        return Err(JetStreamError::Incompatible(format!(
            "stream {name} exists with {} {} but the configuration wants {}; the server cannot change that in place. Either set the configuration to match, or delete the stream (its messages are lost) and run setup again",
            fixed.field, fixed.have, fixed.want
        )));
    }
    // Keep every field we do not manage as the operator left it.
    let mut update = have;
    update.subjects = want.subjects.clone();
    update.discard = want.discard;
    update.max_age = want.max_age;
    update.max_bytes = want.max_bytes;
    if want.duplicate_window != Duration::ZERO {
        update.duplicate_window = want.duplicate_window;
    }
    update.num_replicas = want.num_replicas;
    js.update_stream(update)
        .await
        .map_err(|e| replicas_error(format!("updating stream {name}"), want, e))?;
    Ok(Change::Updated(mismatches))
}

async fn ensure_consumer(
    js: &jetstream::Context,
    stream_name: &str,
    want: &pull::Config,
) -> Result<Change, JetStreamError> {
    use jetstream::context::ConsumerInfoErrorKind;
    let name = want.durable_name.clone().unwrap_or_default();
    let stream = js
        .get_stream_no_info(stream_name)
        .await
        .map_err(|e| api_error(format!("opening stream {stream_name}"), e))?;
    let have = match stream.consumer_info(&name).await {
        Ok(info) => info.config,
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {
            stream
                .create_consumer(want.clone())
                .await
                .map_err(|e| api_error(format!("creating consumer {stream_name}/{name}"), e))?;
            return Ok(Change::Created);
        }
        Err(e) => {
            return Err(api_error(
                format!("looking up consumer {stream_name}/{name}"),
                e,
            ));
        }
    };
    let mismatches = consumer_mismatches(&have, want);
    if mismatches.is_empty() {
        return Ok(Change::Unchanged);
    }
    if let Some(fixed) = mismatches.iter().find(|m| !m.updatable) {
        return Err(JetStreamError::Incompatible(format!(
            "consumer {stream_name}/{name} exists with {} {} but the configuration wants {}; the server cannot change that in place. Delete the consumer (unacknowledged deliveries restart from the stream) and run setup again",
            fixed.field, fixed.have, fixed.want
        )));
    }
    // Creating a durable with the same name updates its editable fields.
    let mut update = pull::Config::try_from_consumer_config(have)
        .map_err(|e| api_error(format!("reading consumer {stream_name}/{name}"), e))?;
    update.ack_wait = want.ack_wait;
    update.max_deliver = want.max_deliver;
    update.max_ack_pending = want.max_ack_pending;
    stream
        .create_consumer(update)
        .await
        .map_err(|e| api_error(format!("updating consumer {stream_name}/{name}"), e))?;
    Ok(Change::Updated(mismatches))
}
