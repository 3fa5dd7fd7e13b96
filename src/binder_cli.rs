//! `xcc binder`: wiring only (the controller lives in `xcc-binder`).

use clap::Args;

#[derive(Args, Debug)]
pub struct BinderArgs {
    /// Namespace of this deployment: imported ServiceRecords and the Services made from them.
    #[arg(long, env = "NAMESPACE", default_value = xcc_proto::names::DEFAULT_NAMESPACE)]
    pub namespace: String,
}

pub async fn run(_args: BinderArgs) -> anyhow::Result<()> {
    anyhow::bail!("xcc binder is being wired up in this build; not available yet")
}
