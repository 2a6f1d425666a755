//! `prefill-handoff setup`.

use super::ConfigArgs;

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`setup` is not built yet")
}
