//! The scenarios: kube-env/build, kube-env/up in a temporary directory, each
//! scenario in order (arguments filter them by substring), then always
//! kube-env/down. Exits non-zero if any scenario failed, or if the
//! environment could not run at all: it never skips.
//!
//!     cargo test -p lamina-kube-e2e --test scenarios -- restore
//!
//! Scenarios of two storage nodes (TWO_NODES) start kube-env with
//! KUBE_ENV_NODES=2 when they are chosen, and those of three (THREE_NODES)
//! with KUBE_ENV_NODES=3 (and Lamina's controllers replacing replicas after
//! REPLACE_AFTER), unless KUBE_ENV_NODES says otherwise; the others run the same either way (kube-env's classes keep
//! their volumes on node 1). Scenarios with real pods (KUBELET) start it
//! with KUBE_ENV_KUBELET=1 the same way.
//!
//! The scenarios of NODE_POD run Lamina's node side as a cluster does: the
//! chart's node and keeper pods, from the image deploy/image/build makes of
//! the `lamina` under test, on kube-env's kubelet (KUBE_ENV_NODE_POD=1). They
//! get an environment of their own, after the others'.

mod cross_node;
mod env;
mod full_clone;
mod groups;
mod install;
mod namespaces;
mod node;
mod pods;
mod replicated;
mod scale;
mod schedules;
mod snapshots;

use anyhow::{bail, Context, Result};
use env::Env;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

type Scenario = fn(&Env) -> Result<()>;

/// In priority order; each runs in a namespace of its own name.
const SCENARIOS: &[(&str, Scenario)] = &[
    ("snapshot-ready", snapshots::snapshot_ready),
    ("restore-from-snapshot", snapshots::restore_from_snapshot),
    ("clone-from-pvc", snapshots::clone_from_pvc),
    ("deletion-policy", snapshots::deletion_policy),
    (
        "snapshot-outlives-its-pvc",
        snapshots::snapshot_outlives_its_pvc,
    ),
    ("group-snapshot", groups::group_snapshot),
    (
        "pre-provisioned-content",
        snapshots::pre_provisioned_content,
    ),
    (
        "cross-namespace-restore",
        namespaces::cross_namespace_restore,
    ),
    (
        "full-clone-daemon-killed",
        full_clone::full_clone_daemon_killed,
    ),
    ("node-stage-publish", node::stage_and_publish),
    ("pods-write-restore-read", pods::write_restore_read),
    (
        "pods-first-consumer-group-clone",
        pods::first_consumer_group_clone,
    ),
    ("pods-frozen-snapshot", pods::frozen_snapshot),
    (
        "pods-io-through-restarts-and-growth",
        pods::io_through_restarts_and_growth,
    ),
    ("cross-node-restore", cross_node::cross_node_restore),
    ("replicated-pvc", replicated::replicated_pvc),
    ("replica-replaced", replicated::replica_replaced),
    ("api-server-cut", replicated::api_server_cut),
    (
        "degraded-snapshot-restore",
        replicated::degraded_snapshot_restore,
    ),
    ("front-end-moved", replicated::front_end_moved),
    (
        "front-end-without-replica",
        replicated::front_end_without_replica,
    ),
    ("node-ca-made-once", install::ca_made_once),
    (
        "node-certs-from-cert-manager",
        install::certs_from_cert_manager,
    ),
    ("snapshot-schedule", schedules::snapshot_schedule),
    ("scale-1000-snapshots", scale::thousand_snapshots),
    ("scale-100-replicated-pvcs", scale::hundred_replicated_pvcs),
    (
        "chart-pods-io-through-restarts-and-growth",
        pods::io_through_restarts_and_growth,
    ),
];

/// The scenarios that need a second storage node.
const TWO_NODES: &[&str] = &["cross-node-restore"];
/// The scenarios that need a third.
const THREE_NODES: &[&str] = &[
    "replicated-pvc",
    "replica-replaced",
    "api-server-cut",
    "degraded-snapshot-restore",
    "front-end-moved",
    "front-end-without-replica",
    "node-ca-made-once",
    "node-certs-from-cert-manager",
    "scale-100-replicated-pvcs",
];
/// How long a replica is faulted on a silent node before Lamina's
/// controllers replace it, in an environment of three nodes: past the
/// few seconds replicated-pvc keeps node 2 down, short enough to wait for
/// in replica-replaced.
const REPLACE_AFTER: &str = "45s";
/// The scenarios that need a real node: a kubelet and a container runtime.
const KUBELET: &[&str] = &[
    "pods-write-restore-read",
    "pods-first-consumer-group-clone",
    "pods-frozen-snapshot",
    "pods-io-through-restarts-and-growth",
];
/// The scenarios whose node side is the chart's pods (see the top).
const NODE_POD: &[&str] = &["chart-pods-io-through-restarts-and-growth"];

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let chosen: Vec<_> = SCENARIOS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if chosen.is_empty() {
        println!(
            "no scenario matches {filters:?}; there are: {:?}",
            SCENARIOS.iter().map(|s| s.0).collect::<Vec<_>>()
        );
        return ExitCode::FAILURE;
    }
    if let Err(e) = preconditions() {
        println!("kube-env scenarios cannot run: {e:#}");
        return ExitCode::FAILURE;
    }
    let (in_pods, on_host): (Vec<_>, Vec<_>) = chosen
        .into_iter()
        .partition(|(name, _)| NODE_POD.contains(name));
    let mut ok = true;
    if !on_host.is_empty() {
        let three = on_host.iter().any(|(n, _)| THREE_NODES.contains(n));
        let two = on_host.iter().any(|(n, _)| TWO_NODES.contains(n));
        if (two || three) && std::env::var_os("KUBE_ENV_NODES").is_none() {
            // Read by kube-env/up, which inherits this process's environment;
            // set before any thread is started.
            std::env::set_var("KUBE_ENV_NODES", if three { "3" } else { "2" });
        }
        if three && std::env::var_os("KUBE_ENV_REPLACE_REPLICAS_AFTER").is_none() {
            // As above.
            std::env::set_var("KUBE_ENV_REPLACE_REPLICAS_AFTER", REPLACE_AFTER);
        }
        if on_host.iter().any(|(n, _)| KUBELET.contains(n))
            && std::env::var_os("KUBE_ENV_KUBELET").is_none()
        {
            // As above.
            std::env::set_var("KUBE_ENV_KUBELET", "1");
        }
        ok &= run_in_env(&on_host, false);
    }
    if !in_pods.is_empty() {
        ok &= run_in_env(&in_pods, true);
    }
    if ok {
        println!("all scenarios passed");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One environment (its node side in the chart's pods if `node_pod`): up,
/// the scenarios in order, the RBAC check, down. False if anything failed;
/// the logs of a failed run are kept.
fn run_in_env(chosen: &[(&str, Scenario)], node_pod: bool) -> bool {
    let dir = match tempfile::Builder::new().prefix("kube-env-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            println!("kube-env scenarios: no temporary directory: {e}");
            return false;
        }
    };
    let started = Instant::now();
    let up = catch_unwind(AssertUnwindSafe(|| {
        if node_pod {
            Env::up_node_pod(dir.path())
        } else {
            Env::up(dir.path())
        }
    }));
    let env = match up {
        Ok(Ok(env)) => env,
        Ok(Err(e)) => return give_up(dir, &format!("{e:#}")),
        Err(_) => return give_up(dir, "kube-env/up panicked"),
    };
    println!(
        "kube-env up in {:.1} s ({}{})",
        started.elapsed().as_secs_f64(),
        dir.path().display(),
        if node_pod {
            ", Lamina's node side in the chart's pods"
        } else {
            ""
        }
    );

    let mut failed = Vec::new();
    for (name, run) in chosen {
        let t = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| run(&env)));
        let secs = t.elapsed().as_secs_f64();
        match outcome {
            Ok(Ok(())) => println!("scenario {name} ... ok ({secs:.1} s)"),
            Ok(Err(e)) => {
                println!(
                    "scenario {name} ... FAILED ({secs:.1} s)\n{}",
                    indent(&format!("{e:#}"))
                );
                failed.push(*name);
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                println!("scenario {name} ... PANICKED ({secs:.1} s): {msg}");
                failed.push(*name);
            }
        }
    }
    // The sidecars run as the chart's ServiceAccount: nothing they tried
    // during the scenarios may have been forbidden.
    match env.forbidden() {
        Ok(lines) if lines.is_empty() => println!("check chart-rbac-enough ... ok"),
        Ok(lines) => {
            println!(
                "check chart-rbac-enough ... FAILED: the chart's RBAC forbade:\n{}",
                indent(&lines.join("\n"))
            );
            failed.push("chart-rbac-enough");
        }
        Err(e) => {
            println!("check chart-rbac-enough ... FAILED: {e:#}");
            failed.push("chart-rbac-enough");
        }
    }
    let down = env.down();
    if let Err(e) = &down {
        println!("kube-env/down: {e:#}");
    }
    if !failed.is_empty() || down.is_err() {
        // Keep the logs of a failed run for whoever reads it.
        let kept = dir.keep();
        println!(
            "failed: {failed:?}; the environment's logs are in {}/logs",
            kept.display()
        );
        return false;
    }
    true
}

/// What the environment needs that only the machine can give: fail with
/// the reason rather than skip.
fn preconditions() -> Result<()> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("they need root (the node scenario mounts ext4 over nbdfuse and loop devices)");
    }
    for (tool, package) in [
        ("etcd", "etcd-server"),
        ("openssl", "openssl"),
        ("curl", "curl"),
        ("python3", "python3"),
        ("go", "golang-go (Go 1.26)"),
        ("qemu-io", "qemu-utils"),
        ("qemu-img", "qemu-utils"),
        ("nbdcopy", "libnbd-bin"),
        ("nbdkit", "nbdkit"),
        ("nbdfuse", "nbdfuse"),
    ] {
        if which(tool).is_none()
            && !(tool == "go" && PathBuf::from("/usr/local/go/bin/go").exists())
        {
            bail!("`{tool}` is not installed: apt-get install {package}");
        }
    }
    Ok(())
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// kube-env/up failed: stop what it started, keep its logs, and fail.
fn give_up(dir: tempfile::TempDir, why: &str) -> bool {
    println!("kube-env/up failed:\n{}", indent(why));
    if let Err(e) = env::down(dir.path()).context("kube-env/down after a failed up") {
        println!("{e:#}");
    }
    println!("logs kept in {}/logs", dir.keep().display());
    false
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}\n")).collect()
}
