//! `xcc crds`: the CustomResourceDefinitions of ServiceRecord and RemoteRegistry, generated from
//! the Rust types in `xcc_proto::crd`. Printed as one YAML stream, or written one file per CRD
//! (how `deploy/crds/` is regenerated; a test fails when the checked-in files drift).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

#[derive(Args, Debug)]
pub struct CrdsArgs {
    /// Write one `<crd name>.yaml` per CRD into this directory instead of printing them, e.g.
    /// `--dir deploy/crds`.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

pub fn run(args: CrdsArgs) -> anyhow::Result<()> {
    match args.dir {
        None => {
            print!("{}", xcc_proto::crd::crds_yaml()?);
            Ok(())
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, text) in xcc_proto::crd::crd_files()? {
                let path = dir.join(name);
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}
