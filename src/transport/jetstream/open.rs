//! Opening the shared durable consumer, with a clear error when it or its
//! stream is missing.

use super::OpenError;
use async_nats::jetstream::{self, consumer::PullConsumer, context::ConsumerInfoErrorKind};

/// Opens the shared durable consumer `stream`/`consumer`.
pub async fn open(
    js: &jetstream::Context,
    stream: &str,
    consumer: &str,
) -> Result<PullConsumer, OpenError> {
    let handle = js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| OpenError::Api(format!("opening stream {stream}: {e}")))?;
    let missing = |what: String| {
        OpenError::Missing(format!(
            "{what} does not exist; run `prefill-handoff setup` or set jetstream.create = true"
        ))
    };
    match handle.consumer_info(consumer).await {
        Ok(_) => {}
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {
            return Err(missing(format!("consumer {stream}/{consumer}")));
        }
        Err(e) if e.kind() == ConsumerInfoErrorKind::StreamNotFound => {
            return Err(missing(format!("stream {stream}")));
        }
        Err(e) => {
            return Err(OpenError::Api(format!(
                "reading consumer {stream}/{consumer}: {e}"
            )));
        }
    }
    handle
        .get_consumer(consumer)
        .await
        .map_err(|e| OpenError::Api(format!("opening consumer {consumer}: {e}")))
}
