//! Logs: one subscriber for the process, text or JSON, filtered by `RUST_LOG` or `--log-level`.

use tracing_subscriber::EnvFilter;

use crate::settings::LogFormat;

/// Installs the global subscriber; a second call (tests) is a no-op.
pub fn init(level: &str, format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
