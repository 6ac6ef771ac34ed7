//! The library's single error type.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while preparing or driving the test environment.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    #[error("`{command}` failed ({status}): {stderr}")]
    Command { command: String, status: String, stderr: String },

    #[error("invalid JSON in {context}: {source}")]
    Json {
        context: String,
        #[source]
        source: serde_json::Error,
    },

    #[error("containerd exited during startup ({status}); log tail:\n{log}")]
    ContainerdExited { status: String, log: String },

    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },

    #[error("cannot connect to CRI socket {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },

    #[error("CRI {call} failed: {source}")]
    Cri {
        call: &'static str,
        #[source]
        source: Box<tonic::Status>,
    },

    #[error("CRI {call} returned an unexpected answer: {detail}")]
    CriAnswer { call: &'static str, detail: String },

    #[error("no free pod subnet: all of 10.244.1.0/24 ..= 10.244.254.0/24 are held by other instances")]
    NoFreeSubnet,

    #[error("image {image} is not visible through the CRI image service after import")]
    ImageNotVisible { image: String },

    #[error("invalid OCI layout {path}: {detail}")]
    InvalidLayout { path: PathBuf, detail: String },
}

pub type Result<T, E = TestkitError> = std::result::Result<T, E>;

/// Attach a human-readable context to an `io::Error`.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| TestkitError::Io { context: context(), source })
    }
}

impl TestkitError {
    pub(crate) fn cri(call: &'static str) -> impl FnOnce(tonic::Status) -> Self {
        move |status| TestkitError::Cri { call, source: Box::new(status) }
    }
}
