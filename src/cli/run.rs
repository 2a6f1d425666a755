//! `prefill-handoff run`.

use super::ConfigArgs;

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    let config = args.load()?;
    super::logging::init(&config.log_format);
    anyhow::bail!("`run` is not built yet")
}
