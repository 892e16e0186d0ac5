#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Spec(String),
}

impl Error {
    pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}
