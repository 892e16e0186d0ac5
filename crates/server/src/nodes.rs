//! The node list's API: `/v1/nodes` (list, add) and `/v1/nodes/{name}`
//! (get, remove). The list names other Lamina nodes and where their
//! transfer listeners answer, so that requests can name a node alone (a
//! clone from another node's snapshot today; a volume's replicas next).
//! It only records: reaching a node, and checking that its certificate
//! carries its name, is the transfer protocol's work when a request uses
//! it. The store keeps the records (`store::nodes`).

use crate::error::Failure;
use crate::extract::{body, created, St};
use crate::state::blocking;
use crate::store::{Added, NodeRec};
use axum::extract::rejection::JsonRejection;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use lamina_api as api;

type R<T> = Result<T, Failure>;

pub use crate::state::nodes::{check_name, no_such_node, resolve, MAX_NAME, NAME_PATTERN};

/// A transfer address: `HOST:PORT`, the port 1 to 65535, an IPv6 host in
/// brackets.
pub fn check_address(address: &str) -> R<()> {
    let bad = |why: &str| {
        Failure::invalid(format!(
            "node address {address:?}: {why}; give HOST:PORT (an IPv6 host in brackets, e.g. [fd00::7]:7481)"
        ))
    };
    let (host, port) = address.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(bad("the port must be 1 to 65535")),
    }
    let host_ok = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok()),
        None => {
            !host.is_empty()
                && host.len() <= 253
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        }
    };
    if host_ok {
        Ok(())
    } else {
        Err(bad(
            "the host must be a DNS name, an IPv4 address or a bracketed IPv6 address",
        ))
    }
}

fn view(rec: NodeRec) -> api::Node {
    api::Node {
        name: rec.name,
        address: rec.address,
        added: crate::schedules::rfc3339(rec.added),
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[utoipa::path(get, path = "/v1/nodes",
    responses((status = 200, description = "the node list, by name", body = Vec<api::Node>),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn list_nodes(st: St) -> R<Json<Vec<api::Node>>> {
    let s = st.0.clone();
    blocking(move || Ok(Json(s.store.nodes()?.into_iter().map(view).collect()))).await
}

#[utoipa::path(post, path = "/v1/nodes", request_body = api::AddNode,
    responses((status = 201, description = "added", body = api::Node),
        (status = 200, description = "in the list already with the same address", body = api::Node),
        (status = 400, description = "bad name or address", body = api::ApiError),
        (status = 409, description = "in the list with another address", body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn add_node(
    st: St,
    b: Result<Json<api::AddNode>, JsonRejection>,
) -> R<(StatusCode, Json<api::Node>)> {
    let req = body(b)?;
    check_name(&req.name)?;
    check_address(&req.address)?;
    let s = st.0.clone();
    let rec = NodeRec {
        name: req.name,
        address: req.address,
        added: now(),
    };
    let added = blocking(move || Ok(s.store.add_node(&rec)?)).await?;
    match added {
        Added::New(rec) => {
            tracing::info!(node = %rec.name, address = %rec.address, "node added");
            Ok((created(true), Json(view(rec))))
        }
        Added::Same(rec) => Ok((created(false), Json(view(rec)))),
        Added::Other(rec) => Err(Failure::exists(
            format!(
                "node {:?} is in the list with address {}",
                rec.name, rec.address
            ),
            &format!(
                "to change its address, remove it first: lamina node remove {}",
                rec.name
            ),
        )),
    }
}

#[utoipa::path(get, path = "/v1/nodes/{name}", params(("name" = String, Path, description = "node name")),
    responses((status = 200, body = api::Node), (status = 404, body = api::ApiError),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn get_node(st: St, Path(name): Path<String>) -> R<Json<api::Node>> {
    let s = st.0.clone();
    blocking(move || {
        s.store
            .node(&name)?
            .map(|r| Json(view(r)))
            .ok_or_else(|| no_such_node(&name))
    })
    .await
}

#[utoipa::path(delete, path = "/v1/nodes/{name}", params(("name" = String, Path, description = "node name")),
    responses((status = 200, description = "removed (or was absent: `existed: false`)", body = api::Removed),
        (status = 500, body = api::ApiError), (status = 503, body = api::ApiError)))]
pub async fn remove_node(st: St, Path(name): Path<String>) -> R<Json<api::Removed>> {
    let s = st.0.clone();
    let what = format!("node {name}");
    let existed = blocking(move || Ok(s.store.remove_node(&name)?)).await?;
    if existed {
        tracing::info!(node = %what, "node removed");
    }
    Ok(Json(api::Removed {
        what,
        existed,
        left: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses_are_checked() {
        for ok in ["n1", "node-b.zone-1", "a", &"a".repeat(63)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a b",
            &"a".repeat(64),
            ".a",
            "é",
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        for ok in ["10.0.0.7:7481", "node-b:1", "[fd00::7]:7481", "[::1]:65535"] {
            assert!(check_address(ok).is_ok(), "{ok}");
        }
        for bad in [
            "10.0.0.7",
            "10.0.0.7:",
            ":7481",
            "10.0.0.7:0",
            "10.0.0.7:65536",
            "fd00::7:7481",
            "[fd00::7:7481",
            "[nothex]:7481",
            "a b:1",
            "h:1x",
        ] {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }
}
