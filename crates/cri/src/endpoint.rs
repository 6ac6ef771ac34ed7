//! Endpoint strings as the Go kubelet accepts them on Linux.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::{CriError, EndpointProblem};

/// A parsed runtime or image service endpoint (always a Unix socket on Linux).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    raw: String,
    path: PathBuf,
    /// True when the endpoint was a bare path rather than a `unix://` URL.
    pub deprecated_form: bool,
}

impl Endpoint {
    /// Parses `unix:///path`, or a bare absolute path (accepted, but deprecated upstream).
    pub fn parse(raw: &str) -> Result<Self, CriError> {
        let invalid = |problem| CriError::InvalidEndpoint { endpoint: raw.to_string(), problem };
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Err(invalid(EndpointProblem::Empty));
        }
        let (path, deprecated_form) = match trimmed.split_once("://") {
            Some(("unix", rest)) => (rest, false),
            Some((scheme, _)) => {
                return Err(invalid(EndpointProblem::Scheme(scheme.to_string())));
            }
            None => (trimmed, true),
        };
        if !path.starts_with('/') {
            return Err(invalid(EndpointProblem::RelativePath));
        }
        Ok(Endpoint { raw: raw.to_string(), path: PathBuf::from(path), deprecated_form })
    }

    /// The socket path on disk.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_url_is_accepted() {
        let ep = Endpoint::parse("unix:///run/containerd/containerd.sock").unwrap();
        assert_eq!(ep.path(), Path::new("/run/containerd/containerd.sock"));
        assert!(!ep.deprecated_form);
    }

    #[test]
    fn bare_path_is_accepted_but_marked_deprecated() {
        let ep = Endpoint::parse("/run/crio/crio.sock").unwrap();
        assert_eq!(ep.path(), Path::new("/run/crio/crio.sock"));
        assert!(ep.deprecated_form);
    }

    #[test]
    fn other_schemes_are_rejected_naming_the_endpoint() {
        let err = Endpoint::parse("tcp://127.0.0.1:2375").unwrap_err().to_string();
        assert!(err.contains("tcp://127.0.0.1:2375"), "{err}");
        assert!(err.contains("only unix://"), "{err}");
    }

    #[test]
    fn empty_and_relative_endpoints_are_rejected() {
        assert!(Endpoint::parse("").is_err());
        assert!(Endpoint::parse("unix://relative.sock").is_err());
    }
}
