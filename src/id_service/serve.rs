//! The NATS side of the ID mint service: a queue subscription on the ids
//! subject, so each request is answered by exactly one worker of the fleet.

use super::{Budget, IdRequestResult, answer, unreadable_headers};
use crate::config::Config;
use crate::decision::{ReplyPolicy, Rules};
use crate::headers::{self, TraceHeaders, names::CONTENT_TYPE};
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::wire::Encoding;
use async_nats::Message;
use futures::StreamExt;
use tokio::task::JoinHandle;

/// Where the service listens and where it may answer.
#[derive(Debug, Clone)]
pub struct IdService {
    /// The ids subject (`subjects.ids`, default `{ns}.handoff.ids`).
    pub subject: String,
    /// The queue group shared by the fleet (`queue_group`).
    pub queue_group: String,
    /// Reply subjects are checked like a prefill result's `reply_to`: a
    /// crafted reply subject must not make the worker publish into the
    /// JetStream API, the system account or its own pipeline.
    pub reply_policy: ReplyPolicy,
    /// The service's own budget (`id_service.ids_per_sec`), apart from the
    /// decode jobs' minting.
    pub ids_per_sec: u64,
    /// The most IDs one request may take (`id_service.max_count`).
    pub max_count: u64,
}

impl IdService {
    /// The service `config` sets up; replies are checked as `rules` check a
    /// result's. The budget's ranges are the key table's (`id_service.*`),
    /// checked when the configuration was loaded.
    pub fn from_config(config: &Config, rules: &Rules) -> IdService {
        IdService {
            subject: config.subjects.ids.clone(),
            queue_group: config.queue_group.clone(),
            reply_policy: rules.reply_policy.clone(),
            ids_per_sec: config.id_service.ids_per_sec,
            max_count: config.id_service.max_count,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IdServiceError {
    #[error("cannot subscribe to the ID mint service subject {subject:?} (subjects.ids): {source}")]
    Subscribe {
        subject: String,
        #[source]
        source: async_nats::SubscribeError,
    },
    #[error(
        "cannot confirm the ID mint service subscription on {subject:?} with the NATS server: {source}"
    )]
    Confirm {
        subject: String,
        #[source]
        source: crate::transport::RoundTripError,
    },
}

/// Subscribes (in the queue group) and answers requests on a spawned task
/// until the subscription ends (`client.drain()` or the connection closes).
pub async fn serve(
    client: async_nats::Client,
    service: IdService,
    identity: Identity,
    metrics: Metrics,
) -> Result<JoinHandle<()>, IdServiceError> {
    let mut requests = client
        .queue_subscribe(service.subject.clone(), service.queue_group.clone())
        .await
        .map_err(|source| IdServiceError::Subscribe {
            subject: service.subject.clone(),
            source,
        })?;
    // Once `serve` returns, the server knows the subscription: a request sent
    // from any connection after this reaches the service.
    crate::transport::round_trip(&client)
        .await
        .map_err(|source| IdServiceError::Confirm {
            subject: service.subject.clone(),
            source,
        })?;
    tracing::info!(subject = %service.subject, queue_group = %service.queue_group, "ID mint service listening");
    Ok(tokio::spawn(async move {
        // Owned by this one loop, which answers the requests one at a time.
        let mut budget = Budget::new(
            service.ids_per_sec,
            service.max_count,
            std::time::Instant::now(),
        );
        while let Some(request) = requests.next().await {
            handle(&client, &service, &identity, &mut budget, &metrics, request).await;
        }
        tracing::info!(subject = %service.subject, "ID mint service stopped");
    }))
}

async fn handle(
    client: &async_nats::Client,
    service: &IdService,
    identity: &Identity,
    budget: &mut Budget,
    metrics: &Metrics,
    request: Message,
) {
    let Some(reply) = request.reply.as_ref() else {
        metrics.id_request(IdRequestResult::NoReply, 0);
        tracing::warn!(
            subject = %request.subject,
            "ID request without a reply subject; it cannot be answered (use NATS request/reply)"
        );
        return;
    };
    if let Err(refusal) = service.reply_policy.check(reply.as_str()) {
        metrics.id_request(IdRequestResult::ReplyRefused, 0);
        tracing::warn!(%refusal, "ID request not answered");
        return;
    }
    // Matched without regard to case, like a prefill result's.
    let content_type = headers::first(request.headers.as_ref(), CONTENT_TYPE);
    let encoding = Encoding::from_content_type(content_type);
    // A header block the client could not parse: refused like the pipeline
    // refuses such a result, before its body is read or the budget touched.
    let answer = match headers::block_error(request.headers.as_ref()) {
        Some(what) => unreadable_headers(what),
        None => answer(
            &request.payload,
            encoding,
            identity,
            budget,
            std::time::Instant::now(),
        ),
    };

    // As every output: the answer's own headers, then the request's trace
    // headers (W3C-valid, canonical names).
    let set = crate::decision::content_type(encoding);
    let trace = TraceHeaders::read(request.headers.as_ref());
    metrics.trace_headers_dropped(&trace.dropped);
    let headers = headers::outgoing(set, &trace);
    // Counted before publishing, so a requester that sees the answer sees the
    // count. Minted IDs count even when the answer is lost: they are burnt,
    // never handed out again.
    metrics.id_request(answer.result, answer.minted);
    let published = if headers.is_empty() {
        client.publish(reply.clone(), answer.payload.into()).await
    } else {
        client
            .publish_with_headers(reply.clone(), headers, answer.payload.into())
            .await
    };
    match published {
        Ok(()) => {
            if let Some(detail) = &answer.detail {
                tracing::debug!(result = answer.result.as_str(), %detail, "ID request refused");
            }
        }
        Err(e) => {
            metrics.publish_failed();
            tracing::warn!(error = %e, "could not publish an ID service answer");
        }
    }
}
