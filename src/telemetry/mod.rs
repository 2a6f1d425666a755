//! OpenTelemetry traces over OTLP, so the worker is a hop of the request's
//! trace rather than a gap in it.
//!
//! With `otel.endpoint` (or the standard `OTEL_EXPORTER_OTLP_*ENDPOINT`)
//! set, each result gets one span, a child of the input's `traceparent` (a
//! new root when there is none), started at delivery and ended after
//! settling; the output's `traceparent` names that span, so the decode
//! worker's span hangs under it. Identity changes get spans of their own.
//! Unset: no exporter, no task, and [`ResultSpan::none`] on the hot path.
//!
//! - `settings.rs`: `otel.*` and the `OTEL_*` environment, resolved.
//! - `context.rs`: W3C `traceparent` to a span context and back.
//! - [`span`]: one result's span: stages as events, outcome as attributes.
//! - `identity.rs`: identity states to events.
//! - `export.rs`: the bounded queue and the export task.

mod context;
mod export;
mod identity;
mod settings;
pub mod span;

pub use identity::{IdentityEvent, IdentityEvents};
pub use settings::{Protocol, Settings, SettingsError};
pub use span::{Arrival, ResultSpan};

use crate::headers::TraceHeaders;
use crate::identity::IdentityState;
use crate::metrics::Metrics;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::trace::{Span as _, SpanKind, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanExporter as _};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The service name spans carry unless `OTEL_SERVICE_NAME` says otherwise.
pub const SERVICE_NAME: &str = "prefill-handoff";

/// Tracing could not be started.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter refused its configuration.
    #[error("cannot build the OTLP exporter for {endpoint}: {source}")]
    Exporter {
        endpoint: String,
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// The worker's tracing: clonable, shared by every result in flight.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

struct Inner {
    /// Results: parent-based, `otel.sampling_ratio` for new traces.
    results: SdkTracer,
    /// Identity events: always recorded.
    events: SdkTracer,
    /// Kept so the tracers stay usable; the providers end with the worker.
    _providers: [SdkTracerProvider; 2],
    /// The slot held now, -1 when none (for the results' attribute).
    machine_id: AtomicI32,
    exporter: Mutex<Option<export::Exporter>>,
    settings: Settings,
}

impl Telemetry {
    /// Starts the exporter and its task for `settings`
    /// ([`Settings::from_config`]). Call inside the tokio runtime (the
    /// export task runs on it).
    pub fn start(settings: Settings, metrics: &Metrics) -> Result<Telemetry, TelemetryError> {
        use opentelemetry_otlp::WithExportConfig as _;
        let build = match settings.protocol {
            Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.export_timeout)
                .build(),
            Protocol::Http => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.export_timeout)
                .build(),
        };
        let mut exporter = build.map_err(|source| TelemetryError::Exporter {
            endpoint: settings.endpoint.clone(),
            source,
        })?;
        // The resource's detectors read OTEL_SERVICE_NAME and
        // OTEL_RESOURCE_ATTRIBUTES; the name here is only the default.
        let mut resource = Resource::builder()
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
        if std::env::var("OTEL_SERVICE_NAME").is_ok_and(|n| n.trim().is_empty())
            || std::env::var("OTEL_SERVICE_NAME").is_err()
        {
            resource = resource.with_service_name(SERVICE_NAME);
        }
        let resource = resource.build();
        exporter.set_resource(&resource);
        let (processor, exporter) = export::start(
            exporter,
            settings.queue_spans,
            settings.export_timeout,
            metrics.clone(),
        );
        let provider = |sampler: Sampler| {
            SdkTracerProvider::builder()
                .with_sampler(sampler)
                .with_span_processor(processor.clone())
                .with_resource(resource.clone())
                .build()
        };
        let results_provider = provider(Sampler::ParentBased(Box::new(
            Sampler::TraceIdRatioBased(settings.sampling_ratio),
        )));
        let events_provider = provider(Sampler::AlwaysOn);
        tracing::info!(
            endpoint = %crate::config::redact_urls(&settings.endpoint),
            protocol = settings.protocol.as_str(),
            sampling_ratio = settings.sampling_ratio,
            queue_spans = settings.queue_spans,
            "exporting traces over OTLP"
        );
        Ok(Telemetry {
            inner: Arc::new(Inner {
                results: results_provider.tracer(SERVICE_NAME),
                events: events_provider.tracer(SERVICE_NAME),
                _providers: [results_provider, events_provider],
                machine_id: AtomicI32::new(-1),
                exporter: Mutex::new(Some(exporter)),
                settings,
            }),
        })
    }

    /// Where and how spans are sent.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The span of one result, started at `received_at`: a child of the
    /// input's copied `traceparent`, sampled as its flag says; a new trace
    /// (sampled at `otel.sampling_ratio`) when there is none. `telemetry`
    /// `None`: [`ResultSpan::none`], at the cost of one branch.
    pub fn result(
        telemetry: Option<&Telemetry>,
        trace: &TraceHeaders,
        arrival: Arrival<'_>,
        received_at: Instant,
    ) -> ResultSpan {
        let Some(telemetry) = telemetry else {
            return ResultSpan::none();
        };
        let parent = match context::remote_parent(trace) {
            Some(remote) => Context::new().with_remote_span_context(remote),
            None => Context::new(),
        };
        let started = SystemTime::now()
            .checked_sub(received_at.elapsed())
            .unwrap_or_else(SystemTime::now);
        let inner = &telemetry.inner;
        let mut span = inner
            .results
            .span_builder(span::RESULT_SPAN)
            .with_kind(SpanKind::Consumer)
            .with_start_time(started)
            .start_with_context(&inner.results, &parent);
        // Attributes only on a span that records: an unsampled one costs no
        // allocation beyond itself.
        if span.is_recording() {
            let machine_id = u16::try_from(inner.machine_id.load(Ordering::Relaxed)).ok();
            span.set_attributes(span::start_attributes(&arrival, machine_id));
        }
        ResultSpan::new(span)
    }

    /// Records one identity change as a span of its own.
    pub fn identity_event(&self, event: IdentityEvent, state: &IdentityState) {
        let inner = &self.inner;
        let mut attributes = vec![KeyValue::new("handoff.fenced", state.fenced)];
        if let Some(m) = state.machine_id {
            attributes.push(KeyValue::new(span::attr::MACHINE_ID, i64::from(m.get())));
        }
        if let Some(lease) = state.lease_id {
            attributes.push(KeyValue::new(
                "handoff.instance_id",
                crate::wire::messages::instance_id(lease),
            ));
        }
        let mut span = inner
            .events
            .span_builder(event.span_name())
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes)
            .start(&inner.events);
        span.end();
    }

    /// Follows the identity: keeps the machine ID for the results' spans and
    /// records slot claimed / fenced / recovered. Ends with the identity.
    pub fn watch_identity(&self, mut states: watch::Receiver<IdentityState>) -> JoinHandle<()> {
        let telemetry = self.clone();
        let mut events = IdentityEvents::default();
        tokio::spawn(async move {
            loop {
                let state = *states.borrow_and_update();
                let machine_id = match state.machine_id {
                    Some(m) if !state.fenced => i32::from(m.get()),
                    _ => -1,
                };
                telemetry
                    .inner
                    .machine_id
                    .store(machine_id, Ordering::Relaxed);
                for event in events.observe(&state) {
                    telemetry.identity_event(event, &state);
                }
                if states.changed().await.is_err() {
                    return;
                }
            }
        })
    }

    /// Exports the spans still queued, within `budget`, and stops the export
    /// task. Spans ended later are not exported.
    pub async fn shutdown(&self, budget: Duration) {
        let exporter = self
            .inner
            .exporter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(exporter) = exporter {
            exporter.shutdown(budget).await;
        }
    }
}
