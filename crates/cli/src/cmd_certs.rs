//! `lamina certs ...`: the certificates nodes present to each other when
//! they copy snapshots between them (lamina-transfer makes them).

use anyhow::{Context, Result};
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum CertsCmd {
    /// Make a cluster CA in DIR (ca.crt, and ca.key: keep it secret).
    CreateCa {
        /// Where the CA goes (created if absent; existing files are not overwritten).
        dir: PathBuf,
    },
    /// Issue a node's certificate, signed by the CA, into OUT (ca.crt, tls.crt, tls.key):
    /// the directory `lamina serve --transfer-tls` takes.
    Issue {
        /// The CA's directory (from `lamina certs create-ca`).
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        /// The node's name: peers check it against the name they were told.
        #[arg(long, value_name = "NAME")]
        node: String,
        /// Where the node's files go.
        out: PathBuf,
    },
}

pub fn run(cmd: CertsCmd) -> Result<()> {
    match cmd {
        CertsCmd::CreateCa { dir } => {
            lamina_transfer::certs::create_ca(&dir)
                .with_context(|| format!("making a CA in {}", dir.display()))?;
            crate::output::outln!("made a CA in {}", dir.display());
        }
        CertsCmd::Issue { ca, node, out } => {
            lamina_transfer::certs::issue(&ca, &node, &out)
                .with_context(|| format!("issuing a certificate for node {node:?}"))?;
            crate::output::outln!("issued a certificate for node {node} in {}", out.display());
        }
    }
    Ok(())
}
