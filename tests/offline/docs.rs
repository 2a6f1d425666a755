//! The documents against the code: every metric the worker registers, every
//! error and dead-letter code and every command is documented in
//! `docs/protocol.md` or `docs/operations.md`, and nothing those documents
//! or the README name as a metric, a code or a command is missing from the
//! code.
//! (Configuration keys against `docs/configuration.md` have their own test.)

use prefill_handoff::decision::{DeadLetterCode, ErrorCode};
use prefill_handoff::metrics::Metrics;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {relative}: {e}"))
}

/// The documents that name metrics and commands: the reference and the
/// README's summary of it.
fn documents() -> String {
    read("docs/protocol.md") + &read("docs/operations.md") + &read("README.md")
}

/// The text of the section under `heading` (a whole `#` line), up to the
/// next heading of the same or a higher level.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let level = heading.bytes().take_while(|&b| b == b'#').count();
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading:?}"))
        + heading.len()
        + 2;
    let rest = &text[start..];
    let end = rest
        .match_indices("\n#")
        .find(|(at, _)| {
            let hashes = rest[at + 1..].bytes().take_while(|&b| b == b'#').count();
            hashes <= level && rest[at + 1 + hashes..].starts_with(' ')
        })
        .map_or(rest.len(), |(at, _)| at);
    &rest[..end]
}

/// The backticked words in the first cell of each table row of `text`.
fn first_cells(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix('|'))
        .filter_map(|row| row.split('|').next())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2).map(str::to_string))
        .collect()
}

/// Every word of `text` that starts with `prefix` and goes on with
/// lowercase letters, digits, `_` or `joiner`.
fn words_with_prefix(text: &str, prefix: &str, joiner: char) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices(prefix) {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            continue;
        }
        let rest = &text[at + prefix.len()..];
        let len = rest
            .find(|c: char| {
                !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == joiner)
            })
            .unwrap_or(rest.len());
        found.insert(format!("{prefix}{}", &rest[..len]));
    }
    found
}

/// The metric names `/metrics` shows, as a scrape sees them (counters with
/// `_total`), from the registry the worker builds.
fn registered_metrics() -> BTreeSet<String> {
    let text = Metrics::new().encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            panic!("a TYPE line without a name and a type: {line:?}");
        };
        let name = if kind == "counter" && !name.ends_with("_total") {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        names.insert(name);
    }
    assert!(names.len() > 10, "too few metrics found in:\n{text}");
    names
}

fn codes() -> BTreeSet<String> {
    let errors = ErrorCode::ALL.iter().map(|c| c.as_str().to_string());
    let dead = DeadLetterCode::ALL.iter().map(|c| c.as_str().to_string());
    errors.chain(dead).collect()
}

/// The commands `prefill-handoff help` lists (the library's and the
/// binary's own `loadgen`), without clap's `help`.
fn commands() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
        .arg("help")
        .output()
        .expect("prefill-handoff help runs");
    let text = String::from_utf8(out.stdout).expect("help is UTF-8");
    let listed = text
        .split("Commands:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no command list in:\n{text}"));
    let names: BTreeSet<String> = listed
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect();
    assert!(names.contains("run") && names.contains("loadgen"), "{text}");
    names
}

fn missing(wanted: &BTreeSet<String>, have: &BTreeSet<String>) -> Vec<String> {
    wanted.difference(have).cloned().collect()
}

#[test]
fn every_registered_metric_is_in_the_operations_metrics_table() {
    let operations = read("docs/operations.md");
    let table = first_cells(section(&operations, "## Metrics"));
    let registered = registered_metrics();
    assert_eq!(
        missing(&registered, &table),
        Vec::<String>::new(),
        "registered by the code but not in docs/operations.md's Metrics table"
    );
    assert_eq!(
        missing(&table, &registered),
        Vec::<String>::new(),
        "in docs/operations.md's Metrics table but not registered by the code"
    );
}

#[test]
fn every_metric_the_documents_name_exists() {
    let registered = registered_metrics();
    let named: BTreeSet<String> = words_with_prefix(&documents(), "handoff_", '_')
        .into_iter()
        // A scrape shows a histogram as these three series.
        .map(|name| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| registered.contains(*base))
                .map_or(name.clone(), str::to_string)
        })
        .collect();
    assert_eq!(
        missing(&named, &registered),
        Vec::<String>::new(),
        "named in docs/protocol.md, docs/operations.md or README.md but not registered by the code"
    );
}

#[test]
fn the_code_tables_list_exactly_the_codes_of_the_code() {
    let codes = codes();
    let protocol = read("docs/protocol.md");
    let operations = read("docs/operations.md");
    for (document, table) in [
        (
            "docs/protocol.md, Codes",
            first_cells(section(&protocol, "## Codes")),
        ),
        (
            "docs/operations.md, Runbook: codes",
            first_cells(section(&operations, "## Runbook: codes")),
        ),
    ] {
        assert_eq!(
            missing(&codes, &table),
            Vec::<String>::new(),
            "codes of the code missing from {document}"
        );
        assert_eq!(
            missing(&table, &codes),
            Vec::<String>::new(),
            "codes in {document} that the code does not have"
        );
    }
}

#[test]
fn every_command_is_documented_and_every_documented_command_exists() {
    let commands = commands();
    let protocol = read("docs/protocol.md");
    let table: BTreeSet<String> = first_cells(section(&protocol, "## Commands"))
        .iter()
        .filter_map(|cell| cell.strip_prefix("prefill-handoff "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert_eq!(
        missing(&commands, &table),
        Vec::<String>::new(),
        "commands missing from docs/protocol.md's Commands table"
    );
    let named: BTreeSet<String> = words_with_prefix(&documents(), "prefill-handoff ", '-')
        .into_iter()
        .filter_map(|w| w.strip_prefix("prefill-handoff ").map(str::to_string))
        .filter(|name| !name.is_empty())
        .collect();
    assert_eq!(
        missing(&named, &commands),
        Vec::<String>::new(),
        "`prefill-handoff COMMAND` in docs/protocol.md, docs/operations.md or README.md naming no command"
    );
}

#[test]
fn the_readme_opens_with_the_demo_and_the_tests() {
    let readme = read("README.md");
    let first_screen: String = readme.lines().take(25).collect::<Vec<_>>().join("\n");
    for command in ["scripts/demo.sh", "scripts/test.sh"] {
        assert!(
            first_screen.contains(command),
            "README.md's first screen does not show {command}"
        );
    }
    assert!(
        readme.lines().count() <= 250,
        "README.md is longer than 250 lines"
    );
}
