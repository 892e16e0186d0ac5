//! The system tools the daemon tests drive: whether one is there, and the
//! qemu-utils calls several tests make.

use crate::{run, Out};
use std::process::Command;

/// Fail (not skip) when a system tool the test drives is not on `PATH`;
/// `package` is the Debian package that installs it.
#[track_caller]
pub fn need(tool: &str, package: &str) {
    assert!(
        on_path(tool),
        "`{tool}` is not installed: apt-get install {package}"
    );
}

/// Whether an executable file `tool` is in a directory of `PATH`.
pub(crate) fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p).any(|d| {
                std::fs::metadata(d.join(tool))
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
        })
        .unwrap_or(false)
}

/// Run qemu-io commands (`-c`) on a raw NBD URI; they must all succeed
/// (qemu-io reports some failures on stdout with exit code 0). Returns stdout.
#[track_caller]
pub fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw", uri]);
    for x in cmds {
        c.args(["-c", x]);
    }
    let out = run(&mut c).ok();
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io {cmds:?}: {out}"
    );
    out
}

/// Run a fio command whose arguments ask for `--output-format=json`; its
/// report, which must say no job failed (fio prints lines such as
/// "connected to NBD server" before the JSON).
#[track_caller]
pub fn fio_report(c: &mut Command) -> serde_json::Value {
    let out = run(c).ok();
    let start = out.find('{').unwrap_or(0);
    let v: serde_json::Value =
        serde_json::from_str(&out[start..]).unwrap_or_else(|e| panic!("fio output: {e}: {out}"));
    assert_eq!(v["jobs"][0]["error"], 0, "fio reported an error: {out}");
    v
}

/// `qemu-img compare` of two raw images (files or NBD URIs): exit code 0
/// when their contents are equal, 1 when they differ.
#[track_caller]
pub fn qemu_img_compare(a: &str, b: &str) -> Out {
    run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", a, b]))
}
