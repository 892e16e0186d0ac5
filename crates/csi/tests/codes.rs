//! The codes the controller answers where the spec names one, against a
//! real daemon (node_env): a capacity Lamina cannot provide, ids far beyond
//! CSI's limit; and, against a real unix socket whose peer closes the
//! connection without answering (as a daemon killed mid-call does), the
//! code a CO retries on.

mod node_env;

use lamina_csi::proto::controller_client::ControllerClient;
use lamina_csi::proto::identity_client::IdentityClient;
use lamina_csi::proto::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use lamina_csi::proto::*;
use node_env::{create_request, mount_cap, Env, LIMIT};
use std::future::Future;
use std::path::Path;
use tokio::io::AsyncReadExt;
use tonic::Code;

const MIB: u64 = 1 << 20;
/// The largest volume: 64 PiB.
const MAX: u64 = 1 << 56;

fn expand_request(id: &str, bytes: u64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap("")),
        ..Default::default()
    }
}

#[test]
fn a_capacity_beyond_64_pib_is_out_of_range() {
    let env = Env::start();
    for bytes in [MAX + 1, MAX + 512, i64::MAX as u64] {
        let e = env
            .call(
                "CreateVolume",
                env.ctl().create_volume(create_request("pvc-huge", bytes)),
            )
            .unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange, "{bytes}: {e:?}");
        assert!(e.message().contains("64 PiB"), "{e:?}");
    }
    assert!(env
        .call("list", env.client.list_volumes())
        .unwrap()
        .is_empty());
    // The largest size is one Lamina makes (thin: nothing is allocated).
    let id = env.create_volume("pvc-max", MAX);
    assert_eq!(env.volume("pvc-max").size, MAX);

    let id_small = env.create_volume("pvc-small", MIB);
    for bytes in [MAX + 1, i64::MAX as u64] {
        let e = env
            .call(
                "ControllerExpandVolume",
                env.ctl()
                    .controller_expand_volume(expand_request(&id_small, bytes)),
            )
            .unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange, "{bytes}: {e:?}");
    }
    assert_eq!(
        env.volume("pvc-small").size,
        MIB,
        "a refused expand changed the volume"
    );
    // Asking a volume of 64 PiB for what it has already is no error.
    let r = env
        .call(
            "ControllerExpandVolume",
            env.ctl().controller_expand_volume(expand_request(&id, MAX)),
        )
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, MAX as i64);

    let cap = env
        .call(
            "GetCapacity",
            env.ctl().get_capacity(GetCapacityRequest::default()),
        )
        .unwrap()
        .into_inner();
    assert_eq!(cap.maximum_volume_size, Some(MAX as i64));
}

/// A 10 kB id (or name, parameter, token) is echoed cut, with its length.
#[test]
fn a_10_kb_id_makes_no_10_kb_message() {
    let env = Env::start();
    let vol = env.create_volume("pvc-1", MIB);
    let staging = env.path("staging");
    // Each shape of id a CO sends, far too long: a volume id, one whose
    // node is well-formed, a snapshot id.
    let long = "a".repeat(10_000);
    let ids = [
        format!("{long}@1"),
        format!("n1:{long}@1"),
        format!("pvc-1/{long}@1"),
    ];
    let mut answers: Vec<(&str, tonic::Status)> = vec![];
    for id in &ids {
        let ctl = env.ctl();
        let node = env.node();
        let mut err = |what: &'static str, r: Result<(), tonic::Status>| {
            answers.push((what, r.expect_err(what)));
        };
        err(
            "ControllerGetVolume",
            env.call(
                "",
                ctl.clone()
                    .controller_get_volume(ControllerGetVolumeRequest {
                        volume_id: id.clone(),
                    }),
            )
            .map(drop),
        );
        err(
            "ValidateVolumeCapabilities",
            env.call(
                "",
                ctl.clone()
                    .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                        volume_id: id.clone(),
                        volume_capabilities: vec![mount_cap("")],
                        ..Default::default()
                    }),
            )
            .map(drop),
        );
        err(
            "ControllerExpandVolume",
            env.call(
                "",
                ctl.clone()
                    .controller_expand_volume(expand_request(id, 2 * MIB)),
            )
            .map(drop),
        );
        err(
            "CreateSnapshot",
            env.call(
                "",
                ctl.clone().create_snapshot(CreateSnapshotRequest {
                    source_volume_id: id.clone(),
                    name: "snap".into(),
                    ..Default::default()
                }),
            )
            .map(drop),
        );
        err(
            "GetSnapshot",
            env.call(
                "",
                ctl.clone().get_snapshot(GetSnapshotRequest {
                    snapshot_id: id.clone(),
                    ..Default::default()
                }),
            )
            .map(drop),
        );
        for source in [
            Source::Volume(VolumeSource {
                volume_id: id.clone(),
            }),
            Source::Snapshot(SnapshotSource {
                snapshot_id: id.clone(),
            }),
        ] {
            let req = CreateVolumeRequest {
                volume_content_source: Some(VolumeContentSource {
                    r#type: Some(source),
                }),
                ..create_request("pvc-new", MIB)
            };
            err(
                "CreateVolume from a source",
                env.call("", ctl.clone().create_volume(req)).map(drop),
            );
        }
        err(
            "CreateVolumeGroupSnapshot",
            env.call(
                "",
                env.group()
                    .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
                        name: "g".into(),
                        source_volume_ids: vec![id.clone()],
                        ..Default::default()
                    }),
            )
            .map(drop),
        );
        err(
            "GetVolumeGroupSnapshot",
            env.call(
                "",
                env.group()
                    .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
                        group_snapshot_id: id.clone(),
                        ..Default::default()
                    }),
            )
            .map(drop),
        );
        err(
            "ListVolumes with a token",
            env.call(
                "",
                ctl.clone().list_volumes(ListVolumesRequest {
                    max_entries: 1,
                    starting_token: id.clone(),
                }),
            )
            .map(drop),
        );
        err(
            "NodeStageVolume",
            env.call(
                "",
                node.clone().node_stage_volume(NodeStageVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: staging.display().to_string(),
                    volume_capability: Some(mount_cap("")),
                    ..Default::default()
                }),
            )
            .map(drop),
        );
        err(
            "NodeGetVolumeStats",
            env.call(
                "",
                node.clone()
                    .node_get_volume_stats(NodeGetVolumeStatsRequest {
                        volume_id: id.clone(),
                        volume_path: staging.display().to_string(),
                        staging_target_path: String::new(),
                    }),
            )
            .map(drop),
        );
    }
    // A name used twice with different sources, and parameters.
    let twice = CreateVolumeRequest {
        name: long.clone(),
        ..create_request("", MIB)
    };
    env.call("CreateVolume", env.ctl().create_volume(twice.clone()))
        .unwrap();
    let from_vol = CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(Source::Volume(VolumeSource { volume_id: vol })),
        }),
        ..twice
    };
    answers.push((
        "CreateVolume of a name made from elsewhere",
        env.call("", env.ctl().create_volume(from_vol)).unwrap_err(),
    ));
    for (k, v) in [
        (long.clone(), "x".to_string()),
        ("clone".into(), long.clone()),
    ] {
        let req = CreateVolumeRequest {
            parameters: [(k, v)].into(),
            ..create_request("pvc-p", MIB)
        };
        answers.push((
            "CreateVolume with a parameter",
            env.call("", env.ctl().create_volume(req)).unwrap_err(),
        ));
    }
    let fs = CreateVolumeRequest {
        volume_capabilities: vec![mount_cap(&long)],
        ..create_request("pvc-fs", MIB)
    };
    answers.push((
        "CreateVolume with a filesystem",
        env.call("", env.ctl().create_volume(fs)).unwrap_err(),
    ));

    for (what, s) in &answers {
        assert!(
            s.message().len() < 400,
            "{what}: {:?}: a message of {} bytes",
            s.code(),
            s.message().len()
        );
        assert!(
            s.message().contains("… (10"),
            "{what}: {:?} {}",
            s.code(),
            s.message()
        );
    }
    // What was echoed is the id's start and its length.
    let (_, s) = &answers[0];
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
    assert!(
        s.message()
            .contains(&format!("\"{}\"… (10002 bytes)", &long[..64])),
        "{}",
        s.message()
    );
}

/// A unix socket whose peer accepts, reads the request (or, with
/// `read: false`, nothing) and closes without answering: what a daemon
/// killed during a call leaves its client with.
fn closing_peer(rt: &tokio::runtime::Runtime, path: &Path, read: bool) {
    let listener = {
        let _g = rt.enter();
        tokio::net::UnixListener::bind(path).unwrap()
    };
    rt.spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            if read {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
            }
            drop(s);
        }
    });
}

#[test]
fn a_daemon_that_closes_the_connection_mid_call_is_unavailable() {
    for read in [true, false] {
        let (dir, rt) = node_env::temp_dir_and_runtime("lcodes");
        let api = dir.path().join("api.sock");
        closing_peer(&rt, &api, read);
        let client = lamina_client::Client::unix(&api);
        let sock = dir.path().join("csi.sock");
        let opts = lamina_csi::Options {
            mode: lamina_csi::Mode::Controller,
            endpoint: format!("unix://{}", sock.display()),
            driver_name: lamina_csi::DRIVER_NAME.into(),
            node_id: "node-1".into(),
            storage_node: "node-1".into(),
            nodes: lamina_csi::NodeSource::Single,
            state_dir: dir.path().join("state"),
            freeze_socket: None,
            client,
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let served = rt.spawn(lamina_csi::serve(opts, async {
            let _ = rx.await;
        }));
        let channel = node_env::connect(&rt, &sock);
        let call = |f: std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::Status>>>>| {
            rt.block_on(async { tokio::time::timeout(LIMIT, f).await })
                .expect("the call answers")
                .unwrap_err()
        };
        let ctl = ControllerClient::new(channel.clone());
        let answers = [
            (
                "CreateVolume",
                call(Box::pin({
                    let mut c = ctl.clone();
                    async move {
                        c.create_volume(create_request("pvc-1", MIB))
                            .await
                            .map(drop)
                    }
                })),
            ),
            (
                "ControllerGetVolume",
                call(Box::pin({
                    let mut c = ctl.clone();
                    async move {
                        c.controller_get_volume(ControllerGetVolumeRequest {
                            volume_id: "pvc-1@1".into(),
                        })
                        .await
                        .map(drop)
                    }
                })),
            ),
            (
                "DeleteVolume",
                call(Box::pin({
                    let mut c = ctl.clone();
                    async move {
                        c.delete_volume(DeleteVolumeRequest {
                            volume_id: "pvc-1@1".into(),
                            ..Default::default()
                        })
                        .await
                        .map(drop)
                    }
                })),
            ),
        ];
        for (what, s) in &answers {
            assert_eq!(s.code(), Code::Unavailable, "read: {read}, {what}: {s:?}");
            assert!(s.message().contains("closed the connection"), "{s:?}");
        }
        // The probe says the daemon is not ready (docs/csi.md).
        let probe = rt
            .block_on(IdentityClient::new(channel).probe(ProbeRequest {}))
            .unwrap_err();
        assert_eq!(probe.code(), Code::FailedPrecondition, "{probe:?}");
        let _ = tx.send(());
        rt.block_on(async { tokio::time::timeout(LIMIT, served).await })
            .expect("the driver stops")
            .unwrap()
            .unwrap();
    }
}
