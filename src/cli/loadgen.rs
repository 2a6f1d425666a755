//! `prefill-handoff loadgen`.

#[derive(Debug, clap::Args)]
pub struct LoadgenArgs {}

pub fn run(args: LoadgenArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`loadgen` is not built yet")
}
