//! `prefill-handoff run`.

use super::ConfigArgs;

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`run` is not built yet")
}
