//! Errors a person can act on.

use std::path::PathBuf;

/// What went wrong talking to a CRI runtime.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("invalid container runtime endpoint {endpoint:?}: {problem}")]
    InvalidEndpoint {
        endpoint: String,
        #[source]
        problem: EndpointProblem,
    },

    #[error(
        "container runtime endpoint {endpoint:?}: socket {} does not exist; is the runtime running?",
        path.display()
    )]
    SocketMissing { endpoint: String, path: PathBuf },

    #[error(
        "container runtime endpoint {endpoint:?}: cannot connect to {}: {source}; is the runtime running?",
        path.display()
    )]
    Unreachable { endpoint: String, path: PathBuf, source: std::io::Error },

    #[error(
        "container runtime endpoint {endpoint:?} is not a CRI v1 runtime (runtime.v1.RuntimeService): {detail}. \
         Built-in Docker support (dockershim) was removed in Kubernetes 1.24; point the endpoint at a CRI v1 \
         runtime such as containerd, CRI-O, or cri-dockerd (for Docker Engine)"
    )]
    NotCriV1 { endpoint: String, detail: String },

    #[error("CRI {op} failed: {message}")]
    Call { op: &'static str, code: Code, message: String },

    #[error("CRI {op} timed out after {timeout:?}")]
    Timeout { op: &'static str, timeout: std::time::Duration },
}

/// What is wrong with a container runtime endpoint's form.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EndpointProblem {
    #[error("the endpoint is empty")]
    Empty,
    #[error("scheme {0:?} is not supported; only unix:// sockets are supported on Linux")]
    Scheme(String),
    #[error("the socket path must be absolute, e.g. unix:///run/containerd/containerd.sock")]
    RelativePath,
}

impl CriError {
    pub(crate) fn call(op: &'static str, status: tonic::Status) -> Self {
        CriError::Call { op, code: Code::from(status.code()), message: status.message().to_string() }
    }

    /// The runtime said the object does not exist (already removed, never created).
    pub fn is_not_found(&self) -> bool {
        match self {
            CriError::Call { code, message, .. } => *code == Code::NotFound || message.contains("not found"),
            _ => false,
        }
    }

    /// The status code of a failed call, if this error came from one.
    pub fn code(&self) -> Option<Code> {
        match self {
            CriError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// A failed call as Go's gRPC client prints it, which is what upstream shows in events
    /// and statuses: `rpc error: code = Unknown desc = …`.
    pub fn grpc_message(&self) -> String {
        match self {
            CriError::Call { code, message, .. } => format!("rpc error: code = {code:?} desc = {message}"),
            other => other.to_string(),
        }
    }
}

/// The status code of a failed call, named as gRPC names them, so that callers match on a
/// type of this crate and never on the transport's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl From<tonic::Code> for Code {
    fn from(code: tonic::Code) -> Self {
        use tonic::Code as T;
        match code {
            T::Ok => Code::Ok,
            T::Cancelled => Code::Cancelled,
            T::Unknown => Code::Unknown,
            T::InvalidArgument => Code::InvalidArgument,
            T::DeadlineExceeded => Code::DeadlineExceeded,
            T::NotFound => Code::NotFound,
            T::AlreadyExists => Code::AlreadyExists,
            T::PermissionDenied => Code::PermissionDenied,
            T::ResourceExhausted => Code::ResourceExhausted,
            T::FailedPrecondition => Code::FailedPrecondition,
            T::Aborted => Code::Aborted,
            T::OutOfRange => Code::OutOfRange,
            T::Unimplemented => Code::Unimplemented,
            T::Internal => Code::Internal,
            T::Unavailable => Code::Unavailable,
            T::DataLoss => Code::DataLoss,
            T::Unauthenticated => Code::Unauthenticated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_calls_read_like_go_grpc_errors() {
        let e = CriError::call("PullImage", tonic::Status::unknown("failed to resolve"));
        assert_eq!(e.grpc_message(), "rpc error: code = Unknown desc = failed to resolve");
        assert_eq!(e.code(), Some(Code::Unknown));
        assert!(CriError::call("RemoveContainer", tonic::Status::not_found("gone")).is_not_found());
    }
}
