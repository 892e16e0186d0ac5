//! Two hosts on one machine for the cross-node case: two network
//! namespaces joined by one veth pair (`eth0` in each, `10.77.K.1` and
//! `10.77.K.2`), so that what one sends the other is counted on the link.
//! Named `lamina-bench-PID-K-a|b`: dropping the [`Link`] deletes them, and
//! [`Link::new`] first deletes those of bench processes no longer running.
//! Needs root and iproute2; without them the case fails saying so.

use super::proc;
use anyhow::{bail, Context, Result};
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

const PREFIX: &str = "lamina-bench-";
static LINKS: AtomicU32 = AtomicU32::new(0);

pub struct Host {
    pub ns: String,
    pub addr: Ipv4Addr,
}

/// Two hosts and the veth pair between them.
pub struct Link {
    pub a: Host,
    pub b: Host,
}

fn ip(args: &[&str]) -> Result<String> {
    proc::run(Command::new("ip").args(args))
}

fn remove_stale() -> Result<()> {
    for line in ip(&["netns", "list"])?.lines() {
        let Some(ns) = line.split_whitespace().next() else {
            continue;
        };
        let pid = ns
            .strip_prefix(PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = ip(&["netns", "delete", ns]);
            }
        }
    }
    Ok(())
}

impl Link {
    pub fn new() -> Result<Link> {
        if !proc::have("ip") {
            bail!("`ip` is not installed: apt-get install iproute2");
        }
        // SAFETY: geteuid(2) reads the caller's effective uid; no memory involved.
        if unsafe { libc::geteuid() } != 0 {
            bail!("the crossnode case needs root: it makes network namespaces and a veth link");
        }
        remove_stale()?;
        let k = LINKS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{PREFIX}{}-{k}", std::process::id());
        let net = (k % 250) as u8;
        let link = Link {
            a: Host {
                ns: format!("{tag}-a"),
                addr: Ipv4Addr::new(10, 77, net, 1),
            },
            b: Host {
                ns: format!("{tag}-b"),
                addr: Ipv4Addr::new(10, 77, net, 2),
            },
        };
        // `link` is dropped (and what exists of it deleted) on any error below.
        for h in [&link.a, &link.b] {
            ip(&["netns", "add", &h.ns])?;
        }
        ip(&[
            "link", "add", "name", "eth0", "netns", &link.a.ns, "type", "veth", "peer", "name",
            "eth0", "netns", &link.b.ns,
        ])
        .context("making the veth link")?;
        for h in [&link.a, &link.b] {
            ip(&[
                "-n",
                &h.ns,
                "addr",
                "add",
                &format!("{}/24", h.addr),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &h.ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &h.ns, "link", "set", "lo", "up"])?;
        }
        Ok(link)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for h in [&self.a, &self.b] {
            if let Err(e) = ip(&["netns", "delete", &h.ns]) {
                eprintln!("  {e:#}");
            }
        }
    }
}

impl Host {
    /// `ip netns exec NS`: what runs a program inside this host.
    pub fn prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.ns]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// `program` inside this host.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }

    /// Bytes this host has sent on the link.
    pub fn tx_bytes(&self) -> Result<u64> {
        let out = ip(&["-n", &self.ns, "-s", "-j", "link", "show", "dev", "eth0"])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        v[0]["stats64"]["tx"]["bytes"]
            .as_u64()
            .with_context(|| format!("no tx bytes in {out}"))
    }
}
