//! `docs/configuration.md` is generated from the key table
//! (`prefill-handoff config-reference`) and must not drift from it.

use prefill_handoff::config::{Config, env_name, reference_markdown};
use std::process::Command;

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");

#[test]
fn docs_configuration_md_is_the_generated_reference() {
    let file = std::fs::read_to_string(FILE).unwrap_or_default();
    let generated = reference_markdown();
    if file != generated {
        let first = file
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or(file.lines().count().min(generated.lines().count()), |i| i);
        panic!(
            "docs/configuration.md differs from the key table at line {}:\n  file: {:?}\n  code: {:?}\n\
             regenerate it: cargo run -- config-reference > docs/configuration.md",
            first + 1,
            file.lines().nth(first).unwrap_or(""),
            generated.lines().nth(first).unwrap_or(""),
        );
    }
}

#[test]
fn the_command_prints_the_reference() {
    let out = Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
        .arg("config-reference")
        .output()
        .expect("run prefill-handoff");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), reference_markdown());
}

/// One row per key, with its environment variable and default.
#[test]
fn every_key_has_its_row() {
    let reference = reference_markdown();
    for key in Config::keys() {
        let row = reference
            .lines()
            .find(|l| l.starts_with(&format!("| `{key}` |")))
            .unwrap_or_else(|| panic!("{key} has no row"));
        assert!(row.contains(&format!("`{}`", env_name(key))), "{row}");
        let meaning = Config::key(key).map(|k| k.meaning).unwrap_or_default();
        assert!(!meaning.is_empty(), "{key} has no meaning");
    }
    let ttl = reference
        .lines()
        .find(|l| l.starts_with("| `lease_ttl_secs` |"))
        .unwrap_or_default();
    assert!(
        ttl.contains("| `10` |") && ttl.contains("2 to 9000000000"),
        "{ttl}"
    );
}
