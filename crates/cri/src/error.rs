//! Errors a person can act on.

use std::path::PathBuf;

/// What went wrong talking to a CRI runtime.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("invalid container runtime endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },

    #[error(
        "container runtime endpoint {endpoint:?}: socket {} does not exist; is the runtime running?",
        path.display()
    )]
    SocketMissing { endpoint: String, path: PathBuf },

    #[error(
        "container runtime endpoint {endpoint:?}: cannot connect to {}: {reason}; is the runtime running?",
        path.display()
    )]
    Unreachable { endpoint: String, path: PathBuf, reason: String },

    #[error(
        "container runtime endpoint {endpoint:?} is not a CRI v1 runtime (runtime.v1.RuntimeService): {detail}. \
         Built-in Docker support (dockershim) was removed in Kubernetes 1.24; point the endpoint at a CRI v1 \
         runtime such as containerd, CRI-O, or cri-dockerd (for Docker Engine)"
    )]
    NotCriV1 { endpoint: String, detail: String },

    #[error("CRI {op} failed: {}", status.message())]
    Call { op: &'static str, status: tonic::Status },

    #[error("CRI {op} timed out after {timeout:?}")]
    Timeout { op: &'static str, timeout: std::time::Duration },
}

impl CriError {
    pub(crate) fn call(op: &'static str, status: tonic::Status) -> Self {
        CriError::Call { op, status }
    }

    /// The runtime said the object does not exist (already removed, never created).
    pub fn is_not_found(&self) -> bool {
        match self {
            CriError::Call { status, .. } => {
                status.code() == tonic::Code::NotFound || status.message().contains("not found")
            }
            _ => false,
        }
    }

    /// The gRPC status code of a failed call, if this error came from one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CriError::Call { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}
