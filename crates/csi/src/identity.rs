//! The identity service: who the plugin is, what it offers, and whether
//! the daemon behind it answers.

use crate::proto::identity_server::Identity;
use crate::proto::plugin_capability::{service, volume_expansion, Service, Type, VolumeExpansion};
use crate::proto::*;
use lamina_client::Client;
use tonic::{Request, Response, Status};

pub struct IdentityService {
    pub(crate) name: String,
    pub(crate) client: Client,
    /// Set for a controller of several nodes: ready when one is known.
    pub(crate) nodes: Option<std::sync::Arc<crate::nodes::NodeSet>>,
    /// Whether this process serves the controller (and group controller).
    pub(crate) controller: bool,
}

fn service(t: service::Type) -> PluginCapability {
    PluginCapability {
        r#type: Some(Type::Service(Service { r#type: t as i32 })),
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let mut caps = vec![service(service::Type::VolumeAccessibilityConstraints)];
        if self.controller {
            caps.push(service(service::Type::ControllerService));
            caps.push(service(service::Type::GroupControllerService));
        }
        // Online: a node that stages on the daemon's file (its size is the
        // volume's) grows the loop device and the filesystem while the
        // volume is in use. A volume staged through an NBD client is grown
        // only while no node uses it, as before (docs/csi.md).
        caps.push(PluginCapability {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            })),
        });
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: caps,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        if let Some(set) = &self.nodes {
            return match set.all().is_empty() {
                false => Ok(Response::new(ProbeResponse { ready: Some(true) })),
                true => Err(Status::failed_precondition(
                    "no storage node known yet (no usable node Secret)",
                )),
            };
        }
        match self.client.health().await {
            Ok(_) => Ok(Response::new(ProbeResponse { ready: Some(true) })),
            Err(e) => Err(Status::failed_precondition(format!(
                "the Lamina daemon does not answer: {}",
                crate::status::message(&e)
            ))),
        }
    }
}
