//! Logs and traces: one subscriber for the process, text or JSON, filtered by `RUST_LOG` or
//! `--log-level`; spans to an OTLP collector when an endpoint is set (else no exporter and no
//! OpenTelemetry layer at all). It must never fail the start for a collector that is away.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (log collectors).
    Json,
}

/// Keeps the trace exporter alive; `shutdown` flushes the spans still buffered.
#[derive(Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            eprintln!("portcullis: flushing traces failed: {e}");
        }
    }
}

/// How traces leave the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (collector port 4317).
    #[default]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318): the Go service's default.
    HttpProtobuf,
}

/// Where traces go, and who they say they come from. No endpoint: no exporter at all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TracingConfig {
    pub endpoint: Option<String>,
    pub protocol: OtlpProtocol,
    pub service_name: String,
    pub service_namespace: Option<String>,
    pub service_instance_id: Option<String>,
    /// Which traces are kept.
    pub sampling: Sampling,
}

/// Which traces are kept: a share of the traces (`ratio`: 0 none, 1 all), and whether a parent's
/// decision (Envoy's `traceparent`) is followed instead where there is one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    pub parent_based: bool,
    pub ratio: f64,
}

impl Default for Sampling {
    /// Parent-based, every trace started here kept.
    fn default() -> Self {
        Sampling {
            parent_based: true,
            ratio: 1.0,
        }
    }
}

impl Sampling {
    fn sampler(self) -> opentelemetry_sdk::trace::Sampler {
        use opentelemetry_sdk::trace::Sampler;
        let root = if self.ratio >= 1.0 {
            Sampler::AlwaysOn
        } else if self.ratio <= 0.0 {
            Sampler::AlwaysOff
        } else {
            Sampler::TraceIdRatioBased(self.ratio)
        };
        if self.parent_based {
            Sampler::ParentBased(Box::new(root))
        } else {
            root
        }
    }
}

fn span_exporter(
    endpoint: &str,
    protocol: OtlpProtocol,
) -> Result<opentelemetry_otlp::SpanExporter, opentelemetry_otlp::ExporterBuildError> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    match protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build(),
        OtlpProtocol::HttpProtobuf => {
            // The standard: the signal's path below the base endpoint.
            let url = if endpoint.ends_with("/v1/traces") {
                endpoint.to_owned()
            } else {
                format!("{}/v1/traces", endpoint.trim_end_matches('/'))
            };
            let client = RuntimeHttpClient {
                handle: tokio::runtime::Handle::try_current().map_err(|e| {
                    opentelemetry_otlp::ExporterBuildError::InternalFailure(format!(
                        "the OTLP/HTTP exporter needs the tokio runtime: {e}"
                    ))
                })?,
                inner: Arc::new(
                    opentelemetry_http::hyper::HyperClient::with_default_connector(
                        Duration::from_secs(10),
                        None,
                    ),
                ),
            };
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(url)
                .build()
        }
    }
}

/// The OTLP/HTTP client: hyper's, run on the service's tokio runtime. The batch span processor
/// exports from a thread of its own, where hyper would find no reactor and panic.
#[derive(Debug)]
struct RuntimeHttpClient {
    handle: tokio::runtime::Handle,
    inner: Arc<opentelemetry_http::hyper::HyperClient>,
}

#[tonic::async_trait]
impl opentelemetry_http::HttpClient for RuntimeHttpClient {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let inner = self.inner.clone();
        self.handle
            .spawn(async move { inner.send_bytes(request).await })
            .await
            .map_err(|e| Box::new(e) as opentelemetry_http::HttpError)?
    }
}

/// Installs the global subscriber (a second call, in tests, is a no-op). Must run inside the
/// tokio runtime when an OTLP endpoint is given: the exporter's connection lives there.
pub fn init(level: &str, format: LogFormat, tracing: &TracingConfig) -> Telemetry {
    let filter = || {
        EnvFilter::try_from_default_env()
            .or_else(|_| EnvFilter::try_new(level))
            .unwrap_or_else(|_| EnvFilter::new("info"))
    };
    let logs = match format {
        // Colours only for a person at a terminal; log collectors get plain text.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    }
    .with_filter(filter());
    let mut telemetry = Telemetry::default();
    let traces = tracing.endpoint.as_deref().and_then(|endpoint| {
        match span_exporter(endpoint, tracing.protocol) {
            Ok(exporter) => {
                let mut resource = opentelemetry_sdk::Resource::builder()
                    .with_service_name(tracing.service_name.clone());
                if let Some(namespace) = &tracing.service_namespace {
                    resource = resource.with_attribute(opentelemetry::KeyValue::new(
                        "service.namespace",
                        namespace.clone(),
                    ));
                }
                if let Some(instance) = &tracing.service_instance_id {
                    resource = resource.with_attribute(opentelemetry::KeyValue::new(
                        "service.instance.id",
                        instance.clone(),
                    ));
                }
                let sampler = tracing.sampling.sampler();
                let provider = SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_sampler(sampler)
                    .with_resource(resource.build())
                    .build();
                let tracer = provider.tracer("portcullis");
                opentelemetry::global::set_text_map_propagator(
                    opentelemetry_sdk::propagation::TraceContextPropagator::new(),
                );
                telemetry.provider = Some(provider);
                // Only our own spans: the call span and what it contains.
                Some(
                    tracing_opentelemetry::layer()
                        .with_tracer(tracer)
                        .with_filter(EnvFilter::new("portcullis=info")),
                )
            }
            Err(e) => {
                eprintln!("portcullis: OTLP exporter for {endpoint} not started: {e}");
                None
            }
        }
    });
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init();
    telemetry
}
