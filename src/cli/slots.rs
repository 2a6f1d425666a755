//! `prefill-handoff slots`.

#[derive(Debug, clap::Args)]
pub struct SlotsArgs {}

pub fn run(args: SlotsArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`slots` is not built yet")
}
