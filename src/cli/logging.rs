//! Log lines on stderr (stdout belongs to the commands' output): `text` or
//! `json` per `log_format`, filtered by `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Calling it again is harmless: the first
/// subscriber stays.
pub fn init(log_format: &str) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => {
            EnvFilter::try_new(&directives).unwrap_or_else(|e| {
                eprintln!("prefill-handoff: RUST_LOG={directives:?} is not a valid filter ({e}); logging at info");
                EnvFilter::new("info")
            })
        }
        _ => EnvFilter::new("info"),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Err only when a subscriber is already installed.
    let _ = if log_format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
