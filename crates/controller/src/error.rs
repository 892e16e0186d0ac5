use std::time::Duration;

/// What can go wrong in the controllers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("daemon of node {node}: {call}: {source}")]
    Engine {
        node: String,
        call: &'static str,
        #[source]
        source: lamina_client::Error,
    },
    #[error("{0}")]
    Refused(String),
    #[error("waiting: {0}")]
    NotYet(String),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    #[error("lost the lease {0}: another replica may act now, so this one stops")]
    LostLease(String),
    #[error("metrics endpoint {addr}: {source}")]
    Metrics {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("CRDs as YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

impl Error {
    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let context = context.into();
        move |source| Error::Kube { context, source }
    }

    /// The event reason for this failure (PascalCase, what `kubectl
    /// describe` shows).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Engine { source, .. } => engine_reason(source),
            Error::Kube { .. } => "ApiError",
            Error::Refused(_) => "Refused",
            Error::NotYet(_) => "Waiting",
            _ => "Failed",
        }
    }
}

/// A daemon error's event reason.
pub fn engine_reason(e: &lamina_client::Error) -> &'static str {
    // Not reached, or cut off mid-call (the daemon stopped or died).
    if e.is_unavailable() {
        return "DaemonUnreachable";
    }
    use lamina_api::ErrorCode as C;
    let Some(code) = e.code() else {
        return "DaemonError";
    };
    match code {
        C::NotFound => "NotFound",
        C::NoSpace => "NoSpace",
        C::Invalid if e.to_string().contains("name") => "InvalidName",
        C::Invalid => "Invalid",
        C::Conflict | C::AlreadyExists => "Conflict",
        C::Unauthorized => "Unauthorized",
        C::Refused => "Refused",
        C::Unavailable | C::Internal | C::Unknown(_) => "DaemonError",
    }
}

/// Seconds to wait before retrying after `failures` failures in a row:
/// 1, 2, 4... up to a minute.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}
