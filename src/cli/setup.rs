//! `prefill-handoff setup`: creates the JetStream streams and the shared
//! consumer, or checks and updates them (idempotent). Prints one line per
//! object: created, unchanged, or updated (with the old and new values).

use super::ConfigArgs;
use super::load::{JetStreamObjects, LoadError};
use crate::config::Config;
use crate::connect::auth_options;
use crate::setup::{self, JetStreamError};
use std::time::Duration;

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    // The JetStream objects are checked here, before connecting.
    let config = args.load_checked(JetStreamObjects::Always)?.config;
    super::logging::init(&config.log_format);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(async {
        let client = connect(&config).await?;
        let js = async_nats::jetstream::new(client.clone());
        let report = setup::ensure(&js, &config).await.map_err(|e| match e {
            // Exit code 2: the configuration asks for something impossible.
            JetStreamError::Wanted(e) => LoadError::from(e).into(),
            other => anyhow::Error::new(other),
        })?;
        let _ = client.flush().await;
        anyhow::Ok(report)
    })?;
    print!("{report}");
    Ok(())
}

/// Connects once, failing fast: `setup` is run by hand or by a deploy step
/// that should learn at once that NATS is unreachable.
async fn connect(config: &Config) -> anyhow::Result<async_nats::Client> {
    let nats = &config.nats;
    let options = async_nats::ConnectOptions::new()
        .name(format!("{} setup", nats.name))
        .connection_timeout(Duration::from_secs(nats.connect_timeout_secs));
    let servers = crate::config::nats_url::parse(&nats.url)?;
    let options = auth_options(options, nats, servers.credentials).await?;
    let shown = crate::config::redact_urls(&nats.url);
    options.connect(servers.addrs).await.map_err(|e| {
        match crate::security::reason::tls_failure(
            &e,
            crate::security::Section::Nats,
            nats.tls.cert_file.is_some(),
        ) {
            Some(reason) => anyhow::anyhow!("TLS to NATS at {shown} failed: {reason}"),
            None => anyhow::Error::new(e).context(format!("cannot connect to NATS at {shown}")),
        }
    })
}
