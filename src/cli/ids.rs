//! `prefill-handoff mint-id` and `decode-id`.

#[derive(Debug, clap::Args)]
pub struct MintArgs {}

#[derive(Debug, clap::Args)]
pub struct DecodeArgs {}

pub fn mint(args: MintArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`mint-id` is not built yet")
}

pub fn decode(args: DecodeArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`decode-id` is not built yet")
}
