//! `prefill-handoff cancel`: cancels requests for operators. Every worker
//! refuses a cancelled request's handoff from then on (`cancelled`) and
//! publishes a KV release notice for it. In JetStream mode the cancel is
//! stored in the cancel stream first, so workers started later honour it.

use super::{ConfigArgs, UsageError};
use crate::cancel::{Cancel, message};
use crate::config::Mode;
use crate::decision::MAX_REQUEST_ID_BYTES;
use crate::headers::TraceHeaders;
use crate::wire::Encoding;
use anyhow::Context;

#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The request IDs to cancel.
    #[arg(required = true, value_name = "REQUEST_ID")]
    pub request_ids: Vec<String>,
    /// Why, quoted in the error responses (at most 256 bytes are kept).
    #[arg(long)]
    pub reason: Option<String>,
    /// Send JSON (with `Content-Type: application/json`) instead of MessagePack.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CancelArgs) -> anyhow::Result<()> {
    if let Some(id) = args
        .request_ids
        .iter()
        .find(|id| !(1..=MAX_REQUEST_ID_BYTES).contains(&id.len()))
    {
        return Err(UsageError(format!(
            "request ID {id:?} is {} bytes; expected 1 to {MAX_REQUEST_ID_BYTES}",
            id.len()
        ))
        .into());
    }
    let config = args.config.load()?;
    super::logging::init(&config.log_format);
    let encoding = if args.json {
        Encoding::Json
    } else {
        Encoding::MsgPack
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = super::setup::connect(&config, "cancel").await?;
        let js = async_nats::jetstream::new(client.clone());
        let subject = &config.subjects.cancel;
        for request_id in &args.request_ids {
            let cancel = Cancel {
                request_id: request_id.clone(),
                reason: args.reason.clone(),
            };
            let set = crate::decision::content_type(encoding);
            let headers = crate::headers::outgoing(set, &TraceHeaders::default());
            let body = message::encode(&cancel, encoding).into();
            if config.mode == Mode::Jetstream {
                // Stored before this says so: a worker started later loads it.
                js.publish_with_headers(subject.clone(), headers, body)
                    .await
                    .with_context(|| format!("publishing the cancel of {request_id}"))?
                    .await
                    .with_context(|| {
                        format!(
                            "the cancel stream {} did not store the cancel of {request_id}",
                            config.jetstream.cancel_stream
                        )
                    })?;
            } else {
                client
                    .publish_with_headers(subject.clone(), headers, body)
                    .await
                    .with_context(|| format!("publishing the cancel of {request_id}"))?;
            }
            println!("cancelled {request_id}");
        }
        client
            .flush()
            .await
            .context("flushing the cancels to NATS")?;
        anyhow::Ok(())
    })
}
