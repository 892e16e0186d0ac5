//! Clones of another node's snapshot, as operations: the request's checks,
//! the description of the source, the record of what the pull copies, the
//! target volume at the source's size, and the pull (`jobs::pull`), which
//! ends the operation.
//!
//! States (docs/transfer.md): recorded `running` (what the seeds call
//! `initiated`) → `succeeded` (`completed`), or `failed` with a reason.

use super::Outcome;
use crate::error::Failure;
use crate::jobs::pull::{api_reason, remote_of};
use crate::state::{blocking, State, Step};
use crate::store::{CloneSource, CopyRec, Op, OpRec};
use lamina_api::{FailureReason, PeerNode};
use lamina_transfer::{Reason, Remote, TransferError};
use std::sync::Arc;

/// The operation a clone request asks for: exactly one source (a
/// snapshot, here or on another node, or a volume); a clone from another
/// node is always full.
pub fn request(req: lamina_api::CreateClone) -> Result<Op, Failure> {
    let source = match (req.from_snapshot, req.from_volume, req.from_node) {
        (Some(s), None, node) => {
            let (v, s) = s.split_once('/').ok_or_else(|| {
                Failure::invalid(format!("from_snapshot takes VOLUME/SNAPSHOT, not {s:?}"))
            })?;
            match node {
                None => CloneSource::Snapshot {
                    volume: v.into(),
                    snapshot: s.into(),
                },
                Some(n) => source(n, v, s)?,
            }
        }
        (None, Some(_), Some(_)) => {
            return Err(Failure::invalid(
                "a clone from another node takes a snapshot (from_snapshot), not a volume",
            ))
        }
        (None, Some(v), None) => CloneSource::Volume { volume: v },
        _ => {
            return Err(Failure::invalid(
                "give exactly one of from_snapshot (VOLUME/SNAPSHOT) or from_volume",
            ))
        }
    };
    let full = req.full || matches!(source, CloneSource::Remote { .. });
    Ok(Op::Clone {
        name: req.name,
        source,
        full,
    })
}

/// The clone source of a request naming another node.
pub fn source(node: PeerNode, volume: &str, snapshot: &str) -> Result<CloneSource, Failure> {
    if node.name.is_empty() || node.address.is_empty() {
        return Err(Failure::invalid(
            "from_node needs the node's name and its transfer address (HOST:PORT)",
        ));
    }
    if !node.address.contains(':') {
        return Err(Failure::invalid(format!(
            "the transfer address of node {:?} must be HOST:PORT, not {:?}",
            node.name, node.address
        )));
    }
    Ok(CloneSource::Remote {
        node: node.name,
        address: node.address,
        volume: volume.into(),
        snapshot: snapshot.into(),
    })
}

/// The reason a remote clone's request failed, as its record keeps it (the
/// messages of [`request_failure`] and of the pull's failures open with it).
pub fn reason_of(rec: &OpRec, f: &Failure) -> Option<FailureReason> {
    if rec.op.kind() != lamina_api::OperationKind::RemoteClone {
        return None;
    }
    let (word, _) = f.1.message.split_once(':')?;
    serde_json::from_value(serde_json::Value::String(word.to_string())).ok()
}

/// A failure of the request itself (before anything is copied), as the API
/// answers it.
fn request_failure(e: &TransferError, remote: &Remote) -> Failure {
    use lamina_api::ErrorCode;
    let msg = format!("{}: {e}", api_reason(e.reason()).as_str());
    let busy = matches!(
        e,
        TransferError::Remote {
            code: lamina_transfer::wire::Code::Busy,
            ..
        }
    );
    match e.reason() {
        Reason::SnapshotMissing => Failure::not_found(msg),
        Reason::SourceUnreachable if busy => Failure::new(
            ErrorCode::Unavailable,
            msg,
            Some(&format!(
                "node {} serves as many transfer sessions as its limits allow; try again later",
                remote.node
            )),
        ),
        Reason::SourceUnreachable => Failure::new(
            ErrorCode::Unavailable,
            msg,
            Some(&format!(
                "is node {} serving transfers at {}? (lamina serve --transfer-listen)",
                remote.node, remote.address
            )),
        ),
        Reason::NoSpace => Failure::new(ErrorCode::NoSpace, msg, None),
        Reason::Refused => Failure::new(
            ErrorCode::Refused,
            msg,
            Some("both nodes need certificates from the same CA (lamina certs issue)"),
        ),
        // The peer broke the protocol, a chunk arrived damaged, or an I/O
        // error on either side: a later attempt may succeed.
        Reason::Protocol | Reason::Checksum | Reason::Io => {
            Failure::new(ErrorCode::Unavailable, msg, None)
        }
    }
}

/// Start (or, at restart, resume) a clone of another node's snapshot.
pub(super) async fn clone(
    st: &Arc<State>,
    rec: &OpRec,
    recovering: bool,
) -> Result<Outcome, Failure> {
    let Op::Clone { name, source, .. } = rec.op.clone() else {
        return Err(Failure::internal("not a clone operation"));
    };
    let Some((remote, rvol, rsnap)) = remote_of(&source) else {
        return Err(Failure::internal("not a remote clone"));
    };
    let Some(identity) = st.identity.clone() else {
        return Err(Failure::invalid(
            "this node has no transfer identity: start lamina serve with --transfer-tls DIR (ca.crt, tls.crt, tls.key; see `lamina certs`)",
        ));
    };
    let mut rec = rec.clone();
    if !recovering {
        if let Some(answer) = super::clones::asked_again(st, &rec.id, &name, &source).await? {
            return Ok(answer);
        }
    }
    if rec.copy.is_none() {
        let (id2, r2, v2, s2) = (
            identity.clone(),
            remote.clone(),
            rvol.clone(),
            rsnap.clone(),
        );
        let n2 = name.clone();
        let described = blocking(move || {
            lamina_engine::check_name(&n2)?;
            lamina_transfer::describe(&id2, &r2, &v2, &s2).map_err(|e| request_failure(&e, &r2))
        })
        .await?;
        rec.total_bytes = described.data_bytes;
        // The replicas of the snapshot's volume that the source named: where
        // the pull goes on if the source is lost.
        let others = crate::jobs::pull::others(&remote, &[], &described.holders);
        if !others.is_empty() {
            tracing::info!(op = %rec.id, others = ?others.iter().map(|o| &o.node).collect::<Vec<_>>(),
                "other nodes hold the snapshot too");
        }
        rec.copy = Some(CopyRec {
            snapshot_id: described.id,
            resent_bytes: Some(0),
            others,
            ..CopyRec::new(rvol.clone(), rsnap.clone(), false)
        });
        rec.reason = None;
        st.transition_async(rec.clone(), Step::Progress).await?;
        let (p, n2) = (st.pool.clone(), name.clone());
        let size = described.size;
        blocking(move || Ok(p.create_volume(&n2, size)?)).await?;
    }
    let (p, n2) = (st.pool.clone(), name.clone());
    let info = match blocking(move || Ok(p.volume_info_by_name(&n2)?)).await {
        Ok(info) => info,
        Err(f) => {
            // Recorded but never made (killed between the two): make it, at
            // the size of the snapshot (of the recorded identity) that the
            // source, or another holder of it, describes.
            let copy = rec.copy.clone().expect("set above");
            let (id2, r2) = (identity.clone(), remote.clone());
            let (p, n2) = (st.pool.clone(), name.clone());
            let made = blocking(move || {
                let mut sources = vec![r2.clone()];
                sources.extend(copy.others.iter().map(crate::jobs::pull::remote_of_peer));
                let mut last = None;
                for r in &sources {
                    match lamina_transfer::describe(&id2, r, &copy.volume, &copy.snapshot) {
                        Ok(d) if d.id == copy.snapshot_id => {
                            return Ok(p.create_volume(&n2, d.size)?);
                        }
                        Ok(_) => {
                            last = Some(Failure::not_found(format!(
                                "snapshot-missing: node {} holds another snapshot {}/{} than the clone started from",
                                r.node, copy.volume, copy.snapshot
                            )))
                        }
                        Err(e) => last = Some(request_failure(&e, r)),
                    }
                }
                Err(last.unwrap_or_else(|| Failure::internal("no source")))
            })
            .await;
            made.map_err(|_| f)?
        }
    };
    crate::jobs::pull::start(st, &rec, &name)?;
    Ok(Outcome::Started {
        info,
        created: !recovering,
        running: Some(rec.id.clone()),
    })
}
