//! Compiles the CSI specification's `csi.proto` (v1.12.0) into Rust at build
//! time. The proto is not copied into this repository: it is read from the
//! spec's own Go module, which `go mod download` fetches into the module
//! cache at the pinned version (or from `LAMINA_CSI_PROTO`, a path to a
//! `csi.proto` of that version). protox parses it in pure Rust, so no
//! system `protoc` is needed.

use std::path::PathBuf;
use std::process::Command;

const MODULE: &str = "github.com/container-storage-interface/spec@v1.12.0";

fn proto_path() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("LAMINA_CSI_PROTO") {
        return Ok(PathBuf::from(p));
    }
    let out = Command::new("go")
        .args(["mod", "download", "-json", MODULE])
        // Outside any Go module, and never upgrading the toolchain.
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .current_dir(std::env::temp_dir())
        .output()
        .map_err(|e| {
            format!(
                "cannot run `go` to fetch the CSI spec ({MODULE}): {e}; install Go, or set \
                 LAMINA_CSI_PROTO to the path of csi.proto from CSI spec v1.12.0"
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    // `go mod download -json` prints one object with a "Dir" field.
    let dir = text
        .lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_prefix("\"Dir\": \"")
                .and_then(|r| r.strip_suffix("\","))
        })
        .ok_or_else(|| {
            format!(
                "`go mod download -json {MODULE}` gave no module directory: {}{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    Ok(PathBuf::from(dir).join("csi.proto"))
}

fn main() {
    println!("cargo:rerun-if-env-changed=LAMINA_CSI_PROTO");
    println!("cargo:rerun-if-changed=build.rs");
    let proto = match proto_path() {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    let dir = proto
        .parent()
        .expect("csi.proto has a directory")
        .to_path_buf();
    let fds = protox::compile([&proto], [&dir]).unwrap_or_else(|e| {
        panic!("cannot compile {}: {e}", proto.display());
    });
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("cannot generate the CSI bindings: {e}"));
}
