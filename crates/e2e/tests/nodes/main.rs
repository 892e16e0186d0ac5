//! What crosses nodes: daemons in network namespaces of their own, their
//! transfer listener, and nodes registering with a real kube-apiserver;
//! one test binary for these suites (see the crate's page).

mod crossnode;
#[path = "../../../controller/tests/support/mod.rs"]
mod kube_env;
mod nbd_client;
mod node_register;
mod replica_clone;
mod replicated;
mod transfer_listener;

use lamina_test_support::Lamina;
use std::sync::LazyLock;

/// The workspace's `lamina`, built by cargo before the first use.
static LAMINA: LazyLock<Lamina> = LazyLock::new(Lamina::built);
