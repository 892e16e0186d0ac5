//! The CSI driver (`lamina csi`) over its unix socket against a real
//! daemon: one test binary for every CSI suite (see the crate's page).

mod controller;
mod group;
mod node_restart;
mod support;

use lamina_test_support::Lamina;
use std::sync::LazyLock;

/// The workspace's `lamina`, built by cargo before the first use.
static LAMINA: LazyLock<Lamina> = LazyLock::new(Lamina::built);
