//! The typed client of the Lamina daemon's HTTP/JSON API: one async method
//! per route, taking and returning `lamina_api` types, and one error type
//! ([`Error`]) carrying the daemon's status and `ApiError`. Every program
//! that drives the daemon (the `lamina` command, the benchmarks, the CSI
//! driver and the Kubernetes controllers of `lamina-controller`) goes
//! through it, so that no path, query or request body is written anywhere
//! else.
//!
//! It owns the transport (unix socket, or TCP with the bearer token), the
//! routes, their encoding and the decoding of answers. It must not know
//! the daemon's data directory layout, print anything, or retry: callers
//! decide what to tell people and when to try again.

mod error;
mod path;
mod transport;

pub use error::{Error, Result, Unreachable};
pub use hyper::StatusCode;
pub use transport::Endpoint;

use hyper::body::Bytes;
use hyper::Method;
use lamina_api as api;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::PathBuf;
use transport::Target;

/// The answer to a create: the object, and whether this call made it
/// (201) or found it there already with the same spec (200).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created<T> {
    pub value: T,
    /// False when it existed already (the call was a no-op).
    pub created: bool,
}

/// A connection description to the daemon; cheap to clone. Each call opens
/// its own connection.
#[derive(Clone, Debug)]
pub struct Client {
    target: Target,
}

impl Client {
    /// The daemon's API on its unix socket (`DATA_DIR/api.sock`).
    pub fn unix(socket: impl Into<PathBuf>) -> Client {
        Client {
            target: Target::Unix(socket.into()),
        }
    }

    /// The daemon's API on TCP at `endpoint` (`http://HOST:PORT`), with the
    /// bearer token it requires there.
    pub fn tcp(endpoint: &str, token: Option<&str>) -> Result<Client> {
        Ok(Client {
            target: Target::Tcp {
                endpoint: Endpoint::parse(endpoint)?,
                token: token.map(|t| t.trim().to_string()),
            },
        })
    }

    /// Where the daemon is looked for: the socket path or the endpoint.
    pub fn describe(&self) -> String {
        self.target.describe()
    }

    /// True for the unix socket.
    pub fn is_unix(&self) -> bool {
        matches!(self.target, Target::Unix(_))
    }

    /// True when a bearer token will be sent (TCP only).
    pub fn has_token(&self) -> bool {
        matches!(self.target, Target::Tcp { token: Some(_), .. })
    }

    // --- the daemon ---

    /// `GET /v1/health`: version, data directory, pool usage.
    pub async fn health(&self) -> Result<api::Health> {
        self.get(&path::api("/health", &[])).await
    }

    /// `GET /v1/pool`: the pool's space, exact (walks what only snapshots
    /// hold, so it costs more than [`Client::health`]).
    pub async fn pool_space(&self) -> Result<api::PoolSpace> {
        self.get(&path::api("/pool", &[])).await
    }

    /// `GET /openapi.json`: the API's description.
    pub async fn openapi(&self) -> Result<serde_json::Value> {
        self.get("/openapi.json").await
    }

    // --- volumes ---

    pub async fn list_volumes(&self) -> Result<Vec<api::Volume>> {
        self.get(&path::api("/volumes", &[])).await
    }

    /// Create a volume; the same name and size again succeeds (`created`
    /// false), another size is refused (409).
    pub async fn create_volume(&self, req: &api::CreateVolume) -> Result<Created<api::Volume>> {
        self.create(&path::api("/volumes", &[]), req).await
    }

    /// Volumes that match the filter (a label selector).
    pub async fn find_volumes(&self, filter: &api::VolumeFilter) -> Result<Vec<api::Volume>> {
        let p = path::with_query(
            path::api("/volumes", &[]),
            &[("selector", filter.selector.clone())],
        );
        self.get(&p).await
    }

    /// Replace a volume's labels; the volume afterwards.
    pub async fn set_volume_labels(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<api::Volume> {
        let body = api::SetLabels {
            labels: labels.clone(),
        };
        Ok(self
            .send(
                Method::PUT,
                &path::api("/volumes/{}/labels", &[name]),
                Some(&body),
            )
            .await?
            .1)
    }

    pub async fn get_volume(&self, name: &str) -> Result<api::Volume> {
        self.get(&path::api("/volumes/{}", &[name])).await
    }

    /// Delete a volume (and its snapshots if `with_snapshots`). A volume
    /// already gone is `existed: false`.
    pub async fn delete_volume(&self, name: &str, with_snapshots: bool) -> Result<api::Removed> {
        let p = path::with_query(
            path::api("/volumes/{}", &[name]),
            &[("with_snapshots", with_snapshots.then(|| "true".into()))],
        );
        self.remove(Method::DELETE, &p, format!("volume {name}"))
            .await
    }

    /// Grow a volume; shrinking is refused (400).
    pub async fn expand_volume(&self, name: &str, req: &api::ExpandVolume) -> Result<api::Volume> {
        let p = path::api("/volumes/{}/expand", &[name]);
        Ok(self.send(Method::POST, &p, Some(req)).await?.1)
    }

    /// Add a replica of volume `name` on node `node` (in the daemon's node
    /// list): made there and copied to by the volume's rebuild.
    pub async fn add_replica(&self, name: &str, node: &str) -> Result<api::Volume> {
        let p = path::api("/volumes/{}/replicas", &[name]);
        let req = api::AddReplica { node: node.into() };
        Ok(self.send(Method::POST, &p, Some(&req)).await?.1)
    }

    /// Take volume `name`'s replica on node `node` out of it (its volume on
    /// that node stays).
    pub async fn remove_replica(&self, name: &str, node: &str) -> Result<api::Removed> {
        let p = path::api("/volumes/{}/replicas/{}", &[name, node]);
        self.remove(
            Method::DELETE,
            &p,
            format!("replica of volume {name} on node {node}"),
        )
        .await
    }

    /// Export a volume over NBD (again: the same export).
    pub async fn attach_volume(&self, name: &str) -> Result<api::Export> {
        self.post_empty(&path::api("/volumes/{}/attach", &[name]))
            .await
    }

    /// Export a volume over NBD and serve it as a file on the daemon's host
    /// ([`lamina_api::Export::file`]), for a loop device. A node that
    /// serves no files answers an error for which
    /// [`Error::is_files_refused`] holds, and attaches nothing.
    pub async fn attach_volume_file(&self, name: &str) -> Result<api::Export> {
        let p = path::with_query(
            path::api("/volumes/{}/attach", &[name]),
            &[("file", Some("true".into()))],
        );
        self.post_empty(&p).await
    }

    /// Take over a replicated volume whose replica this node holds (its
    /// front end's node lost), then export it over NBD: the daemon's
    /// `attach?take_over=true` (docs/replicas.md, "Taking a volume over").
    pub async fn take_over_volume(&self, name: &str) -> Result<api::Export> {
        let p = path::with_query(
            path::api("/volumes/{}/attach", &[name]),
            &[("take_over", Some("true".into()))],
        );
        self.post_empty(&p).await
    }

    /// Stop exporting a volume. Without `force` the daemon refuses (409)
    /// while NBD clients are connected or its file is in use; with it, they
    /// are cut off.
    pub async fn detach_volume(&self, name: &str, force: bool) -> Result<api::Removed> {
        let p = path::with_query(
            path::api("/volumes/{}/detach", &[name]),
            &[("force", force.then(|| "true".into()))],
        );
        self.remove(Method::POST, &p, format!("export {name}"))
            .await
    }

    /// Start copying a linked clone's shared blocks (202): the volume,
    /// `flattening` until the copy ends.
    pub async fn flatten_volume(&self, name: &str) -> Result<api::Volume> {
        self.post_empty(&path::api("/volumes/{}/flatten", &[name]))
            .await
    }

    // --- snapshots ---

    pub async fn list_snapshots(&self, volume: &str) -> Result<Vec<api::Snapshot>> {
        self.get(&path::api("/volumes/{}/snapshots", &[volume]))
            .await
    }

    /// Every snapshot of every volume.
    pub async fn list_all_snapshots(&self) -> Result<Vec<api::Snapshot>> {
        self.get(&path::api("/snapshots", &[])).await
    }

    /// Snapshots of any volume that match the filter, oldest first.
    pub async fn find_snapshots(&self, filter: &api::SnapshotFilter) -> Result<Vec<api::Snapshot>> {
        let p = path::with_query(
            path::api("/snapshots", &[]),
            &[
                ("name", filter.name.clone()),
                ("id", filter.id.map(|n| n.to_string())),
                ("schedule", filter.schedule.clone()),
            ],
        );
        self.get(&p).await
    }

    /// Take a snapshot; the same name and labels again succeeds (`created`
    /// false).
    pub async fn create_snapshot(
        &self,
        volume: &str,
        req: &api::CreateSnapshot,
    ) -> Result<Created<api::Snapshot>> {
        self.create(&path::api("/volumes/{}/snapshots", &[volume]), req)
            .await
    }

    pub async fn get_snapshot(&self, volume: &str, name: &str) -> Result<api::Snapshot> {
        self.get(&path::api("/volumes/{}/snapshots/{}", &[volume, name]))
            .await
    }

    /// Delete a snapshot (its clones keep their data). One already gone
    /// is `existed: false`.
    pub async fn delete_snapshot(&self, volume: &str, name: &str) -> Result<api::Removed> {
        let p = path::api("/volumes/{}/snapshots/{}", &[volume, name]);
        self.remove(Method::DELETE, &p, format!("snapshot {volume}/{name}"))
            .await
    }

    /// Delete the snapshots of `volume` that match every filter of `req`
    /// (or, with `dry_run`, only say which and what that frees).
    pub async fn prune_snapshots(
        &self,
        volume: &str,
        req: &api::PruneSnapshots,
    ) -> Result<api::PruneResult> {
        Ok(self
            .send(
                Method::POST,
                &path::api("/volumes/{}/prune-snapshots", &[volume]),
                Some(req),
            )
            .await?
            .1)
    }

    /// Roll a volume back to a snapshot; the volume afterwards.
    pub async fn revert_snapshot(&self, volume: &str, name: &str) -> Result<api::Volume> {
        self.post_empty(&path::api(
            "/volumes/{}/snapshots/{}/revert",
            &[volume, name],
        ))
        .await
    }

    /// Export a snapshot read-only over NBD.
    pub async fn attach_snapshot(&self, volume: &str, name: &str) -> Result<api::Export> {
        self.post_empty(&path::api(
            "/volumes/{}/snapshots/{}/attach",
            &[volume, name],
        ))
        .await
    }

    pub async fn detach_snapshot(
        &self,
        volume: &str,
        name: &str,
        force: bool,
    ) -> Result<api::Removed> {
        let p = path::with_query(
            path::api("/volumes/{}/snapshots/{}/detach", &[volume, name]),
            &[("force", force.then(|| "true".into()))],
        );
        self.remove(Method::POST, &p, format!("export {volume}@{name}"))
            .await
    }

    // --- group snapshots ---

    /// Take one snapshot of each volume at one instant (crash-consistent
    /// across them); the same group again (same volumes, in any order, and
    /// labels) succeeds (`created` false), another is refused (409).
    pub async fn create_snapshot_group(
        &self,
        req: &api::CreateSnapshotGroup,
    ) -> Result<Created<api::SnapshotGroup>> {
        self.create(&path::api("/snapshot-groups", &[]), req).await
    }

    /// A group snapshot's members, ordered by volume name (404 when none).
    pub async fn get_snapshot_group(&self, name: &str) -> Result<api::SnapshotGroup> {
        self.get(&path::api("/snapshot-groups/{}", &[name])).await
    }

    /// Delete every member of a group snapshot; none there is
    /// `existed: false`.
    pub async fn delete_snapshot_group(&self, name: &str) -> Result<api::Removed> {
        let p = path::api("/snapshot-groups/{}", &[name]);
        self.remove(Method::DELETE, &p, format!("snapshot group {name}"))
            .await
    }

    // --- clones and operations ---

    /// A new volume from a snapshot or a volume: 201 for a linked clone,
    /// 202 for a full clone (whose copy runs on as `operation`), 200 when it
    /// existed already.
    pub async fn create_clone(&self, req: &api::CreateClone) -> Result<Created<api::CloneCreated>> {
        self.create(&path::api("/clones", &[]), req).await
    }

    /// Recorded operations, newest first, filtered.
    pub async fn list_operations(
        &self,
        filter: &api::OperationFilter,
    ) -> Result<Vec<api::Operation>> {
        let state = filter.state.map(|s| {
            serde_json::to_value(s)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default()
        });
        let p = path::with_query(
            path::api("/operations", &[]),
            &[
                ("volume", filter.volume.clone()),
                ("state", state),
                ("limit", filter.limit.map(|n| n.to_string())),
            ],
        );
        self.get(&p).await
    }

    pub async fn get_operation(&self, id: &str) -> Result<api::Operation> {
        self.get(&path::api("/operations/{}", &[id])).await
    }

    // --- the change feed ---

    /// `GET /v1/changes`: the daemon's epoch and change sequence, at once
    /// if it is past `after` (seen in `epoch`), else after the first change
    /// or `wait` (the daemon caps it at 300 s), whichever comes first.
    pub async fn changes(
        &self,
        after: Option<u64>,
        epoch: Option<&str>,
        wait: std::time::Duration,
    ) -> Result<api::Changes> {
        let p = path::with_query(
            path::api("/changes", &[]),
            &[
                ("after", after.map(|n| n.to_string())),
                ("epoch", epoch.map(String::from)),
                ("wait_ms", Some(wait.as_millis().to_string())),
            ],
        );
        self.get(&p).await
    }

    /// The daemon's Prometheus metrics, in the text exposition format.
    pub async fn metrics(&self) -> Result<String> {
        let (_, bytes) = self.exchange::<()>(Method::GET, "/metrics", None).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    // --- schedules ---

    /// Every schedule, by name.
    /// The daemon's node list, by name.
    pub async fn list_nodes(&self) -> Result<Vec<api::Node>> {
        self.get(&path::api("/nodes", &[])).await
    }

    /// Add a node to the list; the same address again succeeds (`created`
    /// false), another is refused (409).
    pub async fn add_node(&self, req: &api::AddNode) -> Result<Created<api::Node>> {
        self.create(&path::api("/nodes", &[]), req).await
    }

    /// Put node `req.name` at `req.address` in the list: added, or in
    /// place of an entry of another address (a node that came back at a
    /// new address).
    pub async fn put_node(&self, req: &api::AddNode) -> Result<()> {
        match self.add_node(req).await {
            Err(e) if e.is_conflict() => {
                self.remove_node(&req.name).await?;
                self.add_node(req).await.map(drop)
            }
            r => r.map(drop),
        }
    }

    pub async fn get_node(&self, name: &str) -> Result<api::Node> {
        self.get(&path::api("/nodes/{}", &[name])).await
    }

    /// Remove a node from the list; an absent one answers `existed: false`.
    pub async fn remove_node(&self, name: &str) -> Result<api::Removed> {
        self.remove(
            Method::DELETE,
            &path::api("/nodes/{}", &[name]),
            format!("node {name}"),
        )
        .await
    }

    pub async fn list_schedules(&self) -> Result<Vec<api::Schedule>> {
        self.get(&path::api("/schedules", &[])).await
    }

    /// Create a schedule; the same spec again succeeds (`created` false).
    pub async fn create_schedule(
        &self,
        spec: &api::ScheduleSpec,
    ) -> Result<Created<api::Schedule>> {
        self.create(&path::api("/schedules", &[]), spec).await
    }

    pub async fn get_schedule(&self, name: &str) -> Result<api::Schedule> {
        self.get(&path::api("/schedules/{}", &[name])).await
    }

    /// Replace schedule `name`'s spec (another `spec.name` renames it; its
    /// snapshots stay its own).
    pub async fn update_schedule(
        &self,
        name: &str,
        spec: &api::ScheduleSpec,
    ) -> Result<api::Schedule> {
        Ok(self
            .send(
                Method::PUT,
                &path::api("/schedules/{}", &[name]),
                Some(spec),
            )
            .await?
            .1)
    }

    /// Delete a schedule, keeping or deleting its snapshots.
    pub async fn delete_schedule(
        &self,
        name: &str,
        snapshots: api::SnapshotsAction,
    ) -> Result<api::ScheduleDeleted> {
        let action = match snapshots {
            api::SnapshotsAction::Keep => "keep",
            api::SnapshotsAction::Delete => "delete",
        };
        let p = path::with_query(
            path::api("/schedules/{}", &[name]),
            &[("snapshots", Some(action.to_string()))],
        );
        Ok(self.send::<(), _>(Method::DELETE, &p, None).await?.1)
    }

    // --- the exchange ---

    async fn get<T: DeserializeOwned>(&self, p: &str) -> Result<T> {
        Ok(self.send::<(), T>(Method::GET, p, None).await?.1)
    }

    async fn post_empty<T: DeserializeOwned>(&self, p: &str) -> Result<T> {
        Ok(self.send::<(), T>(Method::POST, p, None).await?.1)
    }

    async fn create<B: Serialize, T: DeserializeOwned>(
        &self,
        p: &str,
        body: &B,
    ) -> Result<Created<T>> {
        let (status, value) = self.send(Method::POST, p, Some(body)).await?;
        Ok(Created {
            value,
            created: status != StatusCode::OK,
        })
    }

    async fn remove(&self, method: Method, p: &str, what: String) -> Result<api::Removed> {
        let (status, bytes) = self.exchange::<()>(method, p, None).await?;
        decode_removed(&self.target, status, &bytes, what)
    }

    async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        p: &str,
        body: Option<&B>,
    ) -> Result<(StatusCode, T)> {
        let (status, bytes) = self.exchange(method, p, body).await?;
        Ok((status, decode(&self.target, status, &bytes)?))
    }

    /// One request; a non-2xx answer becomes [`Error::Api`].
    async fn exchange<B: Serialize>(
        &self,
        method: Method,
        p: &str,
        body: Option<&B>,
    ) -> Result<(StatusCode, Bytes)> {
        let json = body.map(serde_json::to_vec).transpose().map_err(|e| {
            self.target
                .protocol(None, format!("encoding the request: {e}"))
        })?;
        let (status, bytes) = self.target.send(method, p, json).await?;
        if !status.is_success() {
            return Err(api_error(&self.target, status, &bytes));
        }
        Ok((status, bytes))
    }
}

/// The error a non-2xx answer stands for: the daemon's `ApiError`, or a
/// protocol error when the body is not one (e.g. from a proxy).
fn api_error(target: &Target, status: StatusCode, bytes: &[u8]) -> Error {
    match serde_json::from_slice::<api::ApiError>(bytes) {
        Ok(error) => Error::Api { status, error },
        Err(_) => target.protocol(
            Some(status),
            format!(
                "answered {status} without an API error: {:?}",
                String::from_utf8_lossy(bytes).trim()
            ),
        ),
    }
}

/// A 2xx body as `T`.
fn decode<T: DeserializeOwned>(target: &Target, status: StatusCode, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        target.protocol(
            Some(status),
            format!(
                "answered {status} with a body the client does not understand ({e}): {:?}",
                String::from_utf8_lossy(bytes).trim()
            ),
        )
    })
}

/// A delete's or a detach's answer: the `Removed` body, or an empty 204
/// (daemons before `Removed` existed answered so) meaning it was removed.
fn decode_removed(
    target: &Target,
    status: StatusCode,
    bytes: &[u8],
    what: String,
) -> Result<api::Removed> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(api::Removed {
            what,
            existed: true,
            left: None,
        });
    }
    decode(target, status, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target::Unix("/d/api.sock".into())
    }

    #[test]
    fn error_answers_carry_status_code_message_and_hint() {
        let body =
            br#"{"code":"not_found","message":"volume \"x\" not found","hint":"list volumes"}"#;
        let e = api_error(&target(), StatusCode::NOT_FOUND, body);
        assert!(e.is_not_found());
        assert_eq!(e.code(), Some(&api::ErrorCode::NotFound));
        assert_eq!(e.to_string(), "volume \"x\" not found");
        assert_eq!(e.hint(), Some("list volumes"));

        let e = api_error(
            &target(),
            StatusCode::BAD_GATEWAY,
            b"<html>bad gateway</html>",
        );
        match &e {
            Error::Protocol {
                status,
                detail,
                target,
            } => {
                assert_eq!(*status, Some(StatusCode::BAD_GATEWAY));
                assert!(detail.contains("bad gateway"), "{detail}");
                assert_eq!(target, "/d/api.sock");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(e.status(), Some(StatusCode::BAD_GATEWAY));
    }

    #[test]
    fn removals_accept_an_empty_204_and_the_removed_body() {
        let r = decode_removed(&target(), StatusCode::NO_CONTENT, b"", "volume a".into()).unwrap();
        assert_eq!(
            r,
            api::Removed {
                what: "volume a".into(),
                existed: true,
                left: None,
            }
        );
        let r = decode_removed(
            &target(),
            StatusCode::OK,
            br#"{"what":"volume data","existed":false}"#,
            "volume a".into(),
        )
        .unwrap();
        assert_eq!(
            r,
            api::Removed {
                what: "volume data".into(),
                existed: false,
                left: None,
            }
        );
        assert!(matches!(
            decode_removed(&target(), StatusCode::OK, b"{nope", "v".into()),
            Err(Error::Protocol { .. })
        ));
    }

    #[test]
    fn bodies_of_the_wrong_shape_are_protocol_errors() {
        let e = decode::<api::Volume>(&target(), StatusCode::OK, br#"{"name":1}"#).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Protocol {
                    status: Some(StatusCode::OK),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("the Lamina daemon at /d/api.sock: "),
            "{e}"
        );
    }

    #[test]
    fn clients_describe_where_they_look() {
        let c = Client::unix("/d/api.sock");
        assert!(c.is_unix() && !c.has_token());
        assert_eq!(c.describe(), "/d/api.sock");
        let c = Client::tcp("http://127.0.0.1:7480", Some(" t \n")).unwrap();
        assert!(!c.is_unix() && c.has_token());
        assert_eq!(c.describe(), "http://127.0.0.1:7480");
        assert!(Client::tcp("https://h", None).is_err());
    }
}
