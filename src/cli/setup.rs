//! `prefill-handoff setup`.

use super::ConfigArgs;

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    let config = args.load()?;
    super::logging::init(&config.log_format);
    anyhow::bail!("`setup` is not built yet")
}
