//! (being written)

use crate::suite::Ctx;
use anyhow::{bail, Result};

pub fn run(_ctx: &mut Ctx) -> Result<()> {
    bail!("not written yet")
}
