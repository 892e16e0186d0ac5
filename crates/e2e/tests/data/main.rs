//! The data path end to end: real NBD clients, a file system through
//! nbdfuse, and the daemon killed, starved of disk or stopped under them;
//! one test binary for these suites (see the crate's page).

mod clients;
mod ext4;
mod files;
mod full_disk;
mod kill;
mod shutdown;

use lamina_test_support::Lamina;
use std::sync::LazyLock;

/// The workspace's `lamina`, built by cargo before the first use.
static LAMINA: LazyLock<Lamina> = LazyLock::new(Lamina::built);
