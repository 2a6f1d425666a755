//! `prefill-handoff explain`.

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {}

pub fn run(args: ExplainArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`explain` is not built yet")
}
