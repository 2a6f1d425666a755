//! `prefill-handoff slots`: the claimed machine-ID slots and the live
//! instances, read from etcd.

use crate::identity::registry::SlotEntry;
use std::fmt::Write as _;

#[derive(Debug, clap::Args)]
pub struct SlotsArgs {
    #[command(flatten)]
    pub config: super::ConfigArgs,
    /// Print a JSON array (one object per slot or slotless instance) for scripts.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: SlotsArgs) -> anyhow::Result<()> {
    let config = args
        .config
        .load_checked(super::load::JetStreamObjects::WhenJetStreamMode)?
        .config;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let entries = runtime.block_on(crate::identity::read_slots(&config))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
    } else {
        print!("{}", table(&entries));
    }
    Ok(())
}

/// The human-readable listing: one line per slot, then slotless instances.
pub fn table(entries: &[SlotEntry]) -> String {
    let rows: Vec<[String; 5]> = entries
        .iter()
        .map(|e| {
            [
                e.machine_id.map_or("-".into(), |m| m.to_string()),
                e.lease.clone(),
                e.host.clone().unwrap_or_else(|| "?".into()),
                e.pid.map_or("?".into(), |p| p.to_string()),
                e.age_secs.map_or("?".into(), age),
            ]
        })
        .collect();
    let header = ["MACHINE_ID", "LEASE", "HOST", "PID", "AGE"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    let claimed = entries.iter().filter(|e| e.machine_id.is_some()).count();
    let _ = writeln!(
        out,
        "{claimed} of 1021 slots claimed, {} instance(s) without a slot",
        entries.len() - claimed
    );
    out
}

/// `3d4h`, `2h5m`, `4m12s`, `9s`: the two largest units.
fn age(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_show_the_two_largest_units() {
        for (secs, want) in [
            (0, "0s"),
            (59, "59s"),
            (60, "1m0s"),
            (252, "4m12s"),
            (7500, "2h5m"),
            (273_600, "3d4h"),
        ] {
            assert_eq!(age(secs), want, "{secs}");
        }
    }

    #[test]
    fn table_lists_slots_then_slotless_instances() {
        let entry = |machine_id: Option<u16>, lease: &str, host: Option<&str>| SlotEntry {
            machine_id,
            lease: lease.into(),
            host: host.map(String::from),
            pid: host.map(|_| 7),
            version: None,
            started_at: None,
            age_secs: host.map(|_| 61),
        };
        let text = table(&[
            entry(Some(12), "00000000000000aa", Some("gpu-node-1")),
            entry(None, "00000000000000bb", Some("n2")),
            entry(Some(3), "00000000000000cc", None),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "MACHINE_ID  LEASE             HOST        PID  AGE"
        );
        assert_eq!(
            lines[1],
            "12          00000000000000aa  gpu-node-1  7    1m1s"
        );
        assert_eq!(
            lines[2],
            "-           00000000000000bb  n2          7    1m1s"
        );
        assert_eq!(lines[3], "3           00000000000000cc  ?           ?    ?");
        assert_eq!(
            lines[4],
            "2 of 1021 slots claimed, 1 instance(s) without a slot"
        );
    }
}
