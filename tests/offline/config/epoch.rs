//! `id_epoch`: RFC 3339 in UTC, to Unix milliseconds.

use super::defaults;
use prefill_handoff::config::Config;

/// Columns: text | Unix milliseconds, or `error`.
const EPOCHS: &[&str] = &[
    "2025-01-01T00:00:00Z | 1735689600000",
    "1970-01-01T00:00:00Z | 0",
    "2000-02-29T12:34:56.789Z | 951827696789",
    "2024-02-29T23:59:59.999Z | 1709251199999",
    "2025-06-15T08:30:00.5Z | 1749976200500",
    "2025-06-15T08:30:00.500999Z | 1749976200500",
    "2100-03-01T00:00:00Z | 4107542400000",
    "2025-01-01t00:00:00z | 1735689600000",
    "2025-01-01 00:00:00Z | 1735689600000",
    "2025-01-01T00:00:00+00:00 | 1735689600000",
    "2025-01-01T00:00:00-00:00 | 1735689600000",
    "2025-01-01T00:00:00+01:00 | error",
    "2025-01-01T00:00:00 | error",
    "2025-01-01T00:00:00.Z | error",
    "2025-01-01T00:00:00ZZ | error",
    "2025-1-01T00:00:00Z | error",
    "2025-01-01T24:00:00Z | error",
    "2025-01-01T23:60:00Z | error",
    "2025-01-01T23:59:60Z | error",
    "2025-01-32T00:00:00Z | error",
    "2025-04-31T00:00:00Z | error",
    "2100-02-29T00:00:00Z | error",
    "2025-00-01T00:00:00Z | error",
    "1969-12-31T23:59:59Z | error",
    "１９７０-01-01T00:00:00Z | error",
    " | error",
];

#[test]
fn id_epoch_parses_rfc3339_utc() {
    for row in EPOCHS {
        let (text, want) = row.split_once(" | ").expect("two columns");
        let config = Config {
            id_epoch: text.to_string(),
            ..Config::default()
        };
        match (config.epoch_unix_ms(), want) {
            (Err(e), "error") => assert!(e.to_string().starts_with("id_epoch:"), "{text}: {e}"),
            (Ok(ms), want) => assert_eq!(ms.to_string(), want, "{text}"),
            (Err(e), want) => panic!("{text}: {e}, want {want}"),
        }
    }
    assert_eq!(
        defaults().epoch_unix_ms().unwrap(),
        prefill_handoff::ids::DEFAULT_EPOCH_UNIX_MS
    );
}
