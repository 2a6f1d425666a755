//! `prefill-handoff mint-id` and `decode-id`. No network.
//!
//! `mint-id` uses the same generator as the worker, on the wall clock, so its
//! IDs are exactly what a worker holding that machine ID would mint. It does
//! not claim the slot: IDs from it can collide with a live worker's.

use super::UsageError;
use crate::clock;
use crate::config::Config;
use crate::ids::{IdGenerator, IdLayout, MachineId};
use anyhow::Context;
use serde_json::json;
use std::io::{BufWriter, ErrorKind, Write};

#[derive(Debug, clap::Args)]
pub struct MintArgs {
    /// Machine ID to mint with, in [0, 1021).
    #[arg(long, allow_negative_numbers = true)]
    pub machine_id: i64,
    /// ID layout: `rc21` or `rc22`.
    #[arg(
        long,
        alias = "id-layout",
        default_value = "rc22",
        value_name = "rc21|rc22"
    )]
    pub layout: String,
    /// How many IDs to print, one per line.
    #[arg(long, default_value_t = 1)]
    pub count: u64,
}

#[derive(Debug, clap::Args)]
pub struct DecodeArgs {
    /// The request ID to split into its fields.
    pub id: u64,
    /// ID layout: `rc21` or `rc22`.
    #[arg(
        long,
        alias = "id-layout",
        default_value = "rc22",
        value_name = "rc21|rc22"
    )]
    pub layout: String,
}

fn layout(flag: &str) -> Result<IdLayout, UsageError> {
    flag.parse::<IdLayout>()
        .map_err(|e| UsageError(format!("--layout: {e}")))
}

pub fn mint(args: MintArgs) -> anyhow::Result<()> {
    let layout = layout(&args.layout)?;
    let machine_id = MachineId::new(i128::from(args.machine_id))
        .map_err(|e| UsageError(format!("--machine-id: {e}")))?;
    if args.count == 0 {
        return Err(UsageError("--count must be at least 1".into()).into());
    }
    let epoch = Config::default().epoch_unix_ms()?;
    let mut generator = IdGenerator::new(layout, machine_id);
    let mut out = BufWriter::new(std::io::stdout().lock());
    let written = (0..args.count).try_for_each(|_| {
        let id = generator.next_with(|| clock::since_epoch_ms(epoch));
        writeln!(out, "{id}")
    });
    match written.and_then(|()| out.flush()) {
        // `mint-id --count 1000000 | head` is not a failure.
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to standard output"),
    }
}

pub fn decode(args: DecodeArgs) -> anyhow::Result<()> {
    let layout = layout(&args.layout)?;
    let d = layout
        .decode(args.id)
        .map_err(|e| UsageError(e.to_string()))?;
    let mut fields = json!({
        "timestamp_ms": d.timestamp_ms,
        "machine_id": d.machine_id,
    });
    if let (Some(node), Some(process)) = (d.node_id, d.process_id) {
        fields["node_id"] = json!(node);
        fields["process_id"] = json!(process);
    }
    fields["counter"] = json!(d.counter);
    fields["layout"] = json!(layout.as_str());
    println!("{fields}");
    Ok(())
}
