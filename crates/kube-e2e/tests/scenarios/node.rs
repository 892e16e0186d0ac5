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

/// A `lamina csi --mode node` of one storage node (its daemon's data
/// directory, its node id), on a unix socket in a directory of its own,
/// with a client; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct NodePlugin {
    child: Child,
    pub rt: tokio::runtime::Runtime,
    pub client: NodeClient<Channel>,
    /// Its socket and state, and room for staging paths and targets.
    pub work: tempfile::TempDir,
}

impl NodePlugin {
    /// Started for node `node_id` of `env` (whose daemon it uses), its log
    /// `logs/NAME-plugin.log`.
    pub fn start(env: &Env, node_id: &str, name: &str) -> Result<NodePlugin> {
        let work = tempfile::Builder::new()
            .prefix("kube-env-node-")
            .tempdir()?;
        let sock = work.path().join("csi.sock");
        let log = std::fs::File::create(env.dir.join(format!("logs/{name}-plugin.log")))?;
        let child = Command::new(&env.lamina)
            .args(["csi", "--mode", "node", "--node-id", node_id, "--endpoint"])
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
        let mut child = Some(child);
        let connected = (|| {
            wait("the node plugin's socket", T, |_| {
                Ok(sock.exists().then_some(()))
            })?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let channel = rt.block_on(connect(&sock))?;
            anyhow::Ok((rt, channel))
        })();
        match connected {
            Ok((rt, channel)) => Ok(NodePlugin {
                child: child.take().expect("the plugin's process"),
                client: NodeClient::new(channel),
                rt,
                work,
            }),
            Err(e) => {
                if let Some(mut c) = child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                Err(e)
            }
        }
    }
}

impl NodePlugin {
    /// A guard that, unless [`Staged::done`] is called, unpublishes and
    /// unstages `volume_id` (at `target`, if published, and `staging`) when
    /// dropped: a scenario that fails midway leaves no mount or device
    /// behind it to hold kube-env's teardown.
    pub fn staged(&self, volume_id: &str, staging: &Path, target: Option<&Path>) -> Staged<'_> {
        Staged {
            plugin: self,
            volume_id: volume_id.to_string(),
            staging: path(staging),
            target: target.map(path),
            armed: true,
        }
    }
}

/// See [`NodePlugin::staged`].
pub struct Staged<'a> {
    plugin: &'a NodePlugin,
    volume_id: String,
    staging: String,
    target: Option<String>,
    armed: bool,
}

impl Staged<'_> {
    /// Unstaged by the scenario itself: nothing left to undo.
    pub fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut c = self.plugin.client.clone();
        if let Some(t) = &self.target {
            let _ = self
                .plugin
                .rt
                .block_on(c.node_unpublish_volume(NodeUnpublishVolumeRequest {
                    volume_id: self.volume_id.clone(),
                    target_path: t.clone(),
                }));
        }
        let _ = self
            .plugin
            .rt
            .block_on(c.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: self.volume_id.clone(),
                staging_target_path: self.staging.clone(),
            }));
    }
}

impl Drop for NodePlugin {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child, not reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        if crate::env::wait("the node plugin to stop", Duration::from_secs(20), |_| {
            Ok(self.child.try_wait()?)
        })
        .is_err()
        {
            let _ = self.child.kill();
            let _ = self.child.wait();
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

    let plugin = NodePlugin::start(env, NODE_ID, "node-stage-publish")?;
    let (rt, mut node, work) = (&plugin.rt, plugin.client.clone(), &plugin.work);
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

pub fn path(p: &Path) -> String {
    p.display().to_string()
}

pub fn mounted(p: &Path) -> bool {
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
