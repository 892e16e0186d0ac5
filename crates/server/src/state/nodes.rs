//! The node list as operations use it: a node's name checked, and its
//! address looked up (the HTTP layer's `nodes` module serves the list
//! itself).

use super::State;
use crate::error::Failure;
use lamina_api as api;

type R<T> = Result<T, Failure>;

/// Longest node name: a DNS label's length, as Kubernetes node names and
/// the node certificates' names are kept.
pub const MAX_NAME: usize = 63;

/// [`check_name`]'s rule as the OpenAPI document declares it.
pub const NAME_PATTERN: &str = "^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$";

/// A node name: 1 to 63 lowercase letters, digits, `-` and `.`, starting
/// and ending with a letter or digit.
pub fn check_name(name: &str) -> R<()> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.chars().all(|c| alnum(c) || c == '-' || c == '.')
        && name.starts_with(alnum)
        && name.ends_with(alnum);
    if ok {
        Ok(())
    } else {
        Err(Failure::invalid(format!(
            "node name {name:?}: 1 to {MAX_NAME} lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
        )))
    }
}

/// The answer to a node name the list does not have.
pub fn no_such_node(name: &str) -> Failure {
    Failure::new(
        api::ErrorCode::NotFound,
        format!("no node {name:?} in this daemon's node list"),
        Some("add it with `lamina node add NAME HOST:PORT`, or give its address"),
    )
}

/// `node` with its address from the node list when the request gave none.
pub fn resolve(st: &State, node: api::PeerNode) -> R<api::PeerNode> {
    if !node.address.is_empty() {
        return Ok(node);
    }
    check_name(&node.name)?;
    let rec = st
        .store
        .node(&node.name)?
        .ok_or_else(|| no_such_node(&node.name))?;
    Ok(api::PeerNode {
        name: rec.name,
        address: rec.address,
    })
}

/// Node `name`'s transfer address, from the node list.
pub fn address_of(st: &State, name: &str) -> R<String> {
    check_name(name)?;
    Ok(st
        .store
        .node(name)?
        .ok_or_else(|| no_such_node(name))?
        .address)
}
