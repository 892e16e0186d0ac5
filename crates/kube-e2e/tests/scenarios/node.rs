//! i. The node path without a kubelet: for a PVC the environment
//! provisioned, NodeStageVolume and NodePublishVolume on a `lamina csi
//! --mode node` with the PV's volume handle, fsType and context, a file
//! written, unpublish and unstage, then stage and publish again and the file
//! read back.

use crate::env::{wait, Env, NODE_ID};
use anyhow::{ensure, Context, Result};
use lamina_csi::proto::node_client::NodeClient;
use lamina_csi::proto::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, MountVolume,
};
use lamina_csi::proto::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

const T: Duration = Duration::from_secs(60);

/// The node plugin, stopped (SIGTERM, then SIGKILL) when dropped.
struct NodePlugin(Child);

impl Drop for NodePlugin {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child, not reaped yet.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        if crate::env::wait("the node plugin to stop", Duration::from_secs(20), |_| {
            Ok(self.0.try_wait()?)
        })
        .is_err()
        {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn stage_and_publish(env: &Env) -> Result<()> {
    let ns = "node-stage-publish";
    env.namespace(ns)?;
    env.apply(&crate::env::pvc(ns, "data", "lamina", "64Mi", None))?;
    let pv_name = env.wait_bound(ns, "data", T)?;
    let pv = env.get("", "pv", &pv_name)?.context("PV missing")?;
    let csi = &pv["spec"]["csi"];
    let handle = csi["volumeHandle"]
        .as_str()
        .context("PV has no volumeHandle")?
        .to_string();
    let fs_type = csi["fsType"].as_str().unwrap_or("ext4").to_string();
    let context: HashMap<String, String> = csi["volumeAttributes"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();

    let work = tempfile::Builder::new()
        .prefix("kube-env-node-")
        .tempdir()?;
    let sock = work.path().join("csi.sock");
    let log = std::fs::File::create(env.dir.join("logs/node-stage-publish-plugin.log"))?;
    let child = Command::new(&env.lamina)
        .args(["csi", "--mode", "node", "--node-id", NODE_ID, "--endpoint"])
        .arg(format!("unix://{}", sock.display()))
        .arg("--data-dir")
        .arg(&env.lamina_data)
        .arg("--state-dir")
        .arg(work.path().join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("start lamina csi --mode node")?;
    let _plugin = NodePlugin(child);
    wait("the node plugin's socket", T, |_| {
        Ok(sock.exists().then_some(()))
    })?;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut node = NodeClient::new(rt.block_on(connect(&sock))?);
    let staging = work.path().join("staging");
    let target = work.path().join("target");
    let cap = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type,
            ..Default::default()
        })),
    };
    let stage = NodeStageVolumeRequest {
        volume_id: handle.clone(),
        staging_target_path: path(&staging),
        volume_capability: Some(cap.clone()),
        volume_context: context.clone(),
        ..Default::default()
    };
    let publish = NodePublishVolumeRequest {
        volume_id: handle.clone(),
        staging_target_path: path(&staging),
        target_path: path(&target),
        volume_capability: Some(cap),
        volume_context: context,
        ..Default::default()
    };
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: handle.clone(),
        target_path: path(&target),
    };
    let unstage = NodeUnstageVolumeRequest {
        volume_id: handle.clone(),
        staging_target_path: path(&staging),
    };

    let text = format!("written through {handle}\n");
    rt.block_on(node.node_stage_volume(stage.clone()))
        .context("NodeStageVolume")?;
    rt.block_on(node.node_publish_volume(publish.clone()))
        .context("NodePublishVolume")?;
    std::fs::write(target.join("hello.txt"), &text)
        .context("write a file on the published volume")?;
    rt.block_on(node.node_unpublish_volume(unpublish.clone()))
        .context("NodeUnpublishVolume")?;
    rt.block_on(node.node_unstage_volume(unstage.clone()))
        .context("NodeUnstageVolume")?;
    ensure!(
        !mounted(&target) && !mounted(&staging),
        "a mount is left after unpublish and unstage"
    );
    ensure!(
        !target.join("hello.txt").exists(),
        "the file is visible without the volume mounted"
    );

    rt.block_on(node.node_stage_volume(stage))
        .context("NodeStageVolume, again")?;
    rt.block_on(node.node_publish_volume(publish))
        .context("NodePublishVolume, again")?;
    let back = std::fs::read_to_string(target.join("hello.txt")).context("read the file back");
    rt.block_on(node.node_unpublish_volume(unpublish))
        .context("NodeUnpublishVolume, again")?;
    rt.block_on(node.node_unstage_volume(unstage))
        .context("NodeUnstageVolume, again")?;
    ensure!(back? == text, "the file read back differs");
    Ok(())
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn mounted(p: &Path) -> bool {
    let p = path(p);
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(p.as_str())))
        .unwrap_or(false)
}

async fn connect(sock: &Path) -> Result<Channel> {
    let sock: PathBuf = sock.to_path_buf();
    let connector = tower::service_fn(move |_: Uri| {
        let p = sock.clone();
        async move {
            let s = tokio::net::UnixStream::connect(p).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
        }
    });
    Ok(Endpoint::from_static("http://csi.invalid")
        .connect_with_connector(connector)
        .await?)
}
