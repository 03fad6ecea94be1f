//! The tracing flags: where spans go (OTLP) and which are kept, read from the standard `OTEL_*`
//! variables as the OpenTelemetry SDKs read them. Grouped apart from the rest of `Settings`
//! (flattened into it: the flags and variables are unchanged). It must never accept a
//! combination one part of which would be ignored.

use clap::Args;
use clap::builder::{PossibleValuesParser, TypedValueParser};

use crate::telemetry::{OtlpProtocol, Sampling, TracingConfig};

/// The `OTEL_TRACES_SAMPLER` values Portcullis applies (the others need what it does not ship).
pub const TRACES_SAMPLERS: [&str; 6] = [
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];

#[derive(Clone, Args)]
pub struct TracingSettings {
    /// OTLP collector for traces, e.g. http://otel-collector:4317; the standard variable.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: `grpc` (port 4317) or `http/protobuf` (port 4318); the standard variable.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        default_value = "grpc",
        value_parser = PossibleValuesParser::new(["grpc", "http/protobuf"]).map(|p| {
            if p == "grpc" { OtlpProtocol::Grpc } else { OtlpProtocol::HttpProtobuf }
        })
    )]
    pub otlp_protocol: OtlpProtocol,
    /// The service name traces carry; the standard variable.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "portcullis")]
    pub otel_service_name: String,
    /// Share of the traces started here that are kept (1 = all); Envoy's sampling decision is
    /// followed when it sends one.
    #[arg(long, env = "PORTCULLIS_TRACES_SAMPLING_RATIO")]
    pub traces_sampling_ratio: Option<f64>,
    /// The OpenTelemetry sampler, as the SDKs read the standard variable: `always_on`,
    /// `always_off`, `traceidratio`, `parentbased_always_on`, `parentbased_always_off`,
    /// `parentbased_traceidratio` (default: parent-based, with --traces-sampling-ratio).
    #[arg(
        long,
        env = "OTEL_TRACES_SAMPLER",
        value_parser = PossibleValuesParser::new(TRACES_SAMPLERS)
    )]
    pub traces_sampler: Option<String>,
    /// The share a `*traceidratio` sampler keeps, 0 to 1 (default 1); the standard variable.
    #[arg(long, env = "OTEL_TRACES_SAMPLER_ARG")]
    pub traces_sampler_arg: Option<f64>,
    /// Go mode: TRACING_SERVICE_NAMESPACE.
    #[arg(skip)]
    pub otel_service_namespace: Option<String>,
    /// Go mode: TRACING_SERVICE_INSTANCE_ID.
    #[arg(skip)]
    pub otel_service_instance_id: Option<String>,
}

impl TracingSettings {
    /// Where traces go, as the tracing layer takes it.
    pub fn config(&self) -> TracingConfig {
        TracingConfig {
            endpoint: self.otlp_endpoint.clone().filter(|e| !e.is_empty()),
            protocol: self.otlp_protocol,
            service_name: self.otel_service_name.clone(),
            service_namespace: self.otel_service_namespace.clone(),
            service_instance_id: self.otel_service_instance_id.clone(),
            sampling: self.sampling(),
        }
    }

    /// Which traces are kept: `OTEL_TRACES_SAMPLER` (and its argument) as the OpenTelemetry SDKs
    /// read it, else parent-based with `--traces-sampling-ratio` of the rest (all by default).
    /// Combinations that cannot take effect are refused by `validate`.
    pub fn sampling(&self) -> Sampling {
        let arg = self.traces_sampler_arg.unwrap_or(1.0);
        let (parent_based, ratio) = match self.traces_sampler.as_deref() {
            Some("always_on") => (false, 1.0),
            Some("always_off") => (false, 0.0),
            Some("traceidratio") => (false, arg),
            Some("parentbased_always_on") => (true, 1.0),
            Some("parentbased_always_off") => (true, 0.0),
            Some("parentbased_traceidratio") => (true, arg),
            _ => (true, self.traces_sampling_ratio.unwrap_or(1.0)),
        };
        Sampling {
            parent_based,
            ratio,
        }
    }

    /// Combinations that cannot take effect, or values out of range.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(ratio) = self.traces_sampling_ratio
            && !(0.0..=1.0).contains(&ratio)
        {
            problems.push(format!(
                "--traces-sampling-ratio {ratio} must be a number from 0 to 1"
            ));
        }
        if let Some(sampler) = &self.traces_sampler
            && self.traces_sampling_ratio.is_some()
        {
            problems.push(format!(
                "--traces-sampler {sampler} and --traces-sampling-ratio both set: one of them \
                 would be ignored; keep one"
            ));
        }
        if let Some(arg) = self.traces_sampler_arg {
            let ratio_sampler = self
                .traces_sampler
                .as_deref()
                .is_some_and(|s| s.ends_with("traceidratio"));
            if !ratio_sampler {
                problems.push(format!(
                    "--traces-sampler-arg {arg} set, but only a traceidratio sampler reads it \
                     (--traces-sampler is {})",
                    self.traces_sampler.as_deref().unwrap_or("unset")
                ));
            } else if !(0.0..=1.0).contains(&arg) {
                problems.push(format!(
                    "--traces-sampler-arg {arg} must be a number from 0 to 1"
                ));
            }
        }
        problems
    }
}
