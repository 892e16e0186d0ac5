//! Several hosts on one machine: each a network namespace with an address of
//! its own, all joined to one switch, so that a test can run a daemon per
//! host, cut a host off, slow its link, and count the bytes it sent.
//!
//! The layout of a [`Net`] of n hosts:
//! - a switch namespace holding a bridge `br0`, and n host namespaces;
//! - one veth pair per host: `eth0` in the host, `hI` on the switch's bridge;
//! - host I has `10.A.B.(I+1)/24`, `lo` up.
//!
//! Why a bridge, and why in a namespace of its own rather than in the root
//! one: a bridge gives each host one link to everything (cutting that link is
//! a host falling off the network, its counters are all the host sent and
//! received, and its address is one address whatever the peer), where
//! pairwise veths give a host one address per peer. In the root namespace
//! the bridge's frames would go through the machine's firewall (with
//! `br_netfilter` loaded, a `FORWARD` policy of DROP — Docker's — drops
//! them); a fresh namespace has no rules, and the root namespace is left
//! untouched, so deleting the namespaces removes everything.
//!
//! Names are `lamina-PID-K-ROLE` (K counts the [`Net`]s of this process),
//! so tests running in parallel never collide; a [`Net`] removes its
//! namespaces when dropped (during a panic too), and [`Net::new`] first
//! removes those left by a process that is no longer running. The addresses
//! (`A.B` from the pid and K) differ between the instances of a run; each
//! instance is isolated anyway, its hosts reaching only its own switch.
//!
//! Everything here needs root and iproute2 (`ip`, `tc`): without them a
//! test fails saying so, it is never skipped. Links are slowed with `tbf`
//! ([`Host::shape`]); `netem` is used only where the kernel has it
//! ([`Host::delay`] says whether it did).
//!
//! A test calls [`Net::new`] and the counters, which fail the test; a
//! program that reports errors instead (the benchmarks' cross-node case)
//! calls [`Net::try_new`] and [`Host::try_tx_bytes`].

use crate::{run, try_run, Daemon, Lamina};
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Why a [`Net`] could not be made, or a counter read.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("network namespaces need root (they make namespaces, veth links and a bridge); run as root, as CI does (effective uid here: {uid})")]
    NotRoot { uid: u32 },
    #[error("`{tool}` is not installed: apt-get install {package}")]
    Missing {
        tool: &'static str,
        package: &'static str,
    },
    /// A command that failed or could not run, with its output.
    #[error("{0}")]
    Command(String),
    #[error("{what} printed {out:?}, not the figure wanted")]
    Output { what: String, out: String },
}

/// What every namespace made here is named after.
const PREFIX: &str = "lamina-";

/// Counts the [`Net`]s of this process, for unique names.
static NETS: AtomicU32 = AtomicU32::new(0);

/// A switch and the hosts joined to it; dropping it removes them all.
pub struct Net {
    switch: String,
    hosts: Vec<Host>,
}

/// One host of a [`Net`]: a network namespace with one link to the switch.
pub struct Host {
    ns: String,
    switch: String,
    /// The host's link as the switch sees it.
    port: String,
    addr: Ipv4Addr,
}

/// `ip ARGS`: its stdout, or an error with its output.
fn try_ip(args: &[&str]) -> Result<String, NetError> {
    let o = try_run(Command::new("ip").args(args)).map_err(NetError::Command)?;
    if !o.status.success() {
        return Err(NetError::Command(format!(
            "{} failed ({}): {}",
            o.what,
            o.status,
            o.stderr.trim()
        )));
    }
    Ok(o.stdout)
}

/// `ip ARGS`; the test fails if it does.
#[track_caller]
fn ip(args: &[&str]) -> String {
    try_ip(args).unwrap_or_else(|e| panic!("{e}"))
}

/// `tc ARGS`; the test fails if it does.
#[track_caller]
fn tc(args: &[&str]) -> String {
    run(Command::new("tc").args(args)).ok()
}

/// Every namespace named by this module, whichever process made it.
#[track_caller]
pub fn lamina_namespaces() -> Vec<String> {
    try_lamina_namespaces().unwrap_or_else(|e| panic!("{e}"))
}

fn try_lamina_namespaces() -> Result<Vec<String>, NetError> {
    let out = try_ip(&["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(str::to_string)
        .collect())
}

/// The pid in a name `lamina-PID-...`.
fn owner(ns: &str) -> Option<u32> {
    ns.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Remove the namespaces left by processes that are no longer running.
fn remove_stale() -> Result<(), NetError> {
    for ns in try_lamina_namespaces()? {
        if let Some(pid) = owner(&ns) {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = try_run(Command::new("ip").args(["netns", "delete", &ns]));
            }
        }
    }
    Ok(())
}

/// An error, saying why, unless this process can make namespaces.
fn need_root() -> Result<(), NetError> {
    for tool in ["ip", "tc"] {
        if !crate::tools::on_path(tool) {
            return Err(NetError::Missing {
                tool,
                package: "iproute2",
            });
        }
    }
    // SAFETY: geteuid(2) reads the caller's effective uid; no memory involved.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Err(NetError::NotRoot { uid });
    }
    Ok(())
}

impl Net {
    /// A switch and `n` hosts joined to it, each with `lo` and its link up;
    /// the test fails if they cannot be made.
    #[track_caller]
    pub fn new(n: usize) -> Net {
        Net::try_new(n).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Net::new`], an error if the net cannot be made (what was made of
    /// it is removed).
    pub fn try_new(n: usize) -> Result<Net, NetError> {
        assert!((1..=250).contains(&n), "a Net has 1 to 250 hosts, not {n}");
        need_root()?;
        remove_stale()?;
        let pid = std::process::id();
        let k = NETS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{PREFIX}{pid}-{k}");
        let mix = pid.wrapping_mul(131).wrapping_add(k) & 0xffff;
        let (a, b) = ((mix >> 8) as u8, mix as u8);
        let switch = format!("{tag}-sw");
        // The guard exists before the first namespace does: a failure half
        // way removes what was made.
        let mut net = Net {
            switch: switch.clone(),
            hosts: Vec::new(),
        };
        try_ip(&["netns", "add", &switch])?;
        try_ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        try_ip(&["-n", &switch, "link", "set", "br0", "up"])?;
        for i in 0..n {
            let ns = format!("{tag}-h{i}");
            let port = format!("h{i}");
            try_ip(&["netns", "add", &ns])?;
            net.hosts.push(Host {
                ns: ns.clone(),
                switch: switch.clone(),
                port: port.clone(),
                addr: Ipv4Addr::new(10, a, b, i as u8 + 1),
            });
            try_ip(&[
                "link", "add", "name", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port,
                "netns", &switch,
            ])?;
            try_ip(&["-n", &switch, "link", "set", &port, "master", "br0"])?;
            try_ip(&["-n", &switch, "link", "set", &port, "up"])?;
            let cidr = format!("10.{a}.{b}.{}/24", i + 1);
            try_ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
            try_ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            try_ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The namespaces of this net: the switch's, then the hosts'.
    pub fn namespaces(&self) -> Vec<String> {
        let mut v = vec![self.switch.clone()];
        v.extend(self.hosts.iter().map(|h| h.ns.clone()));
        v
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // No panic here: a second one during a failing test aborts the run.
        for ns in self.namespaces().iter().rev() {
            match try_run(Command::new("ip").args(["netns", "delete", ns])) {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!("ip netns delete {ns}: {}", o.stderr.trim()),
                Err(e) => eprintln!("{e}"),
            }
        }
    }
}

impl Host {
    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.ns
    }

    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// `nsenter --net=/run/netns/NS --`, the prefix that runs a program in
    /// this host (nsenter switches the network namespace and execs the
    /// program: its pid is the program's). Not `ip netns exec`: that gives
    /// each program a mount namespace of its own, a copy of the host's
    /// mounts, and a copy that outlives a container's network namespace
    /// keeps the runtime from removing it (containerd's "failed to remove
    /// netns: device or resource busy", seen with kube-env's node beside
    /// these tests).
    pub fn prefix(&self) -> Vec<String> {
        let net = format!("--net=/run/netns/{}", self.ns);
        ["nsenter", &net, "--"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// `lamina serve` inside this host, with `extra` arguments (its
    /// addresses: `--listen`, `--transfer-listen` on [`Host::addr`]); the
    /// test fails if it does not answer. Its ports are free: the host's
    /// namespace has nothing else listening.
    #[track_caller]
    pub fn serve(&self, lamina: &Lamina, extra: &[&str]) -> Daemon {
        lamina
            .start_in(&self.prefix(), extra)
            .unwrap_or_else(|e| panic!("lamina serve in {} did not start: {e}", self.ns))
    }

    /// `program` run inside this host.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.ns))
            .arg("--")
            .arg(program);
        c
    }

    /// Take the host's link down at the switch: the host keeps its address
    /// and routes, but nothing goes in or out until [`Host::restore`].
    #[track_caller]
    pub fn cut(&self) {
        ip(&["-n", &self.switch, "link", "set", &self.port, "down"]);
    }

    /// Bring the link back up.
    #[track_caller]
    pub fn restore(&self) {
        ip(&["-n", &self.switch, "link", "set", &self.port, "up"]);
    }

    /// Limit what the host sends and what it receives to `bytes_per_sec`
    /// each way (a token bucket filter on both ends of its link).
    #[track_caller]
    pub fn shape(&self, bytes_per_sec: u64) {
        let rate = format!("{}bit", bytes_per_sec.max(1000) * 8);
        // A burst of at least 128 KiB: veth hands over 64 KiB segments.
        let burst = (bytes_per_sec / 20).max(128 << 10).to_string();
        for (ns, dev) in [(&self.ns, "eth0"), (&self.switch, self.port.as_str())] {
            tc(&[
                "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst",
                &burst, "latency", "1s",
            ]);
        }
    }

    /// Remove the limit of [`Host::shape`] (and any delay).
    #[track_caller]
    pub fn unshape(&self) {
        for (ns, dev) in [(&self.ns, "eth0"), (&self.switch, self.port.as_str())] {
            // Deleting the root qdisc when there is none fails: harmless.
            let _ =
                try_run(Command::new("tc").args(["-n", ns, "qdisc", "del", "dev", dev, "root"]));
        }
    }

    /// Delay what the host sends by `d` with netem, if this kernel has it;
    /// false (and nothing changed) where it does not.
    #[track_caller]
    pub fn delay(&self, d: Duration) -> bool {
        let ms = format!("{}ms", d.as_millis());
        let o = run(Command::new("tc").args([
            "-n", &self.ns, "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", &ms,
        ]));
        if o.status.success() {
            return true;
        }
        assert!(
            o.stderr.contains("qdisc kind is unknown"),
            "tc netem failed for another reason than a missing netem: {}",
            o.stderr
        );
        false
    }

    /// Bytes the host has sent on its link.
    #[track_caller]
    pub fn tx_bytes(&self) -> u64 {
        self.stat("tx")
    }

    /// Bytes the host has received on its link.
    #[track_caller]
    pub fn rx_bytes(&self) -> u64 {
        self.stat("rx")
    }

    /// [`Host::tx_bytes`], an error if it cannot be read.
    pub fn try_tx_bytes(&self) -> Result<u64, NetError> {
        self.try_stat("tx")
    }

    #[track_caller]
    fn stat(&self, way: &str) -> u64 {
        self.try_stat(way).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_stat(&self, way: &str) -> Result<u64, NetError> {
        let args = ["-n", &self.ns, "-s", "-j", "link", "show", "dev", "eth0"];
        let out = try_ip(&args)?;
        let bytes = serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v[0]["stats64"][way]["bytes"].as_u64());
        bytes.ok_or_else(|| NetError::Output {
            what: format!("ip {}", args.join(" ")),
            out,
        })
    }

    /// The statistics of the host's root qdisc on `eth0` (as `tc -s -j`
    /// prints them), e.g. `overlimits` of a tbf.
    #[track_caller]
    pub fn qdisc_stats(&self) -> serde_json::Value {
        let out = tc(&["-n", &self.ns, "-s", "-j", "qdisc", "show", "dev", "eth0"]);
        let v: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("tc -j qdisc show printed {out:?}: {e}"));
        v[0].clone()
    }
}

#[cfg(test)]
mod tests;
