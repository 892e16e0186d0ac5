//! Lamina's end-to-end suites: the ones that cross crates, driving the real
//! `lamina` binary as a user or Kubernetes runs it — `lamina serve`, `lamina
//! csi`, two or more nodes talking the transfer protocol, NBD clients and
//! file systems nobody here wrote. What one crate promises is tested in
//! that crate; the CLI's own behaviour (its parsing, output, exit codes,
//! its commands against a daemon) in `crates/cli/tests`. This package has
//! no code of its own beyond this page: its tests use the shared harness,
//! `lamina-test-support`, which has cargo build the binary they run
//! (`Lamina::built`), and must not reach into a crate's internals.
//!
//! Every test binary links the whole workspace, so the suites are grouped
//! into three, one module per former file:
//! - `tests/csi/`: the CSI driver over its socket against a real daemon
//!   (`controller`, `group`, `node_restart`, and `support`, the driver and
//!   its gRPC clients);
//! - `tests/nodes/`: what crosses nodes: clones between namespaced daemons
//!   (`crossnode`), the transfer listener under a flood
//!   (`transfer_listener`), and `lamina node register` against a real
//!   kube-apiserver (`node_register`, on crates/controller's kube-env
//!   support);
//! - `tests/data/`: the data path with real clients and crashes: NBD clients
//!   (`clients`), ext4 through nbdfuse (`ext4`), SIGKILL under load
//!   (`kill`), a full disk (`full_disk`), SIGTERM with a stuck NBD client
//!   (`shutdown`).
//!
//! `cargo test -p lamina-e2e --test data [-- kill::]` runs one group (or
//! one suite of it). Most need root and the packages `.ci/run` installs.
