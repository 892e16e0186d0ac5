//! The Kubernetes commands of a `lamina` built without the `kubernetes`
//! feature (bench/run builds it so): each fails with what to do instead.

use crate::failure::Failure;

fn missing() -> anyhow::Result<()> {
    anyhow::bail!(Failure::new(
        "this lamina was built without its Kubernetes commands (the `kubernetes` feature)"
            .to_string(),
        Some("build it with default features: cargo build --release -p lamina-cli".into()),
    ))
}

pub fn main(_args: Vec<std::ffi::OsString>) -> anyhow::Result<()> {
    missing()
}

pub fn crds() -> anyhow::Result<()> {
    missing()
}
