//! Why a container could not be started: the reasons upstream puts in the container's
//! `state.waiting.reason` (and, for most, in a `Failed` event).

/// A start failure, by upstream's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFailure {
    /// A volume could not be set up; the pod stays `ContainerCreating` (event `FailedMount`).
    ContainerCreating,
    CreatePodSandboxError,
    CreateContainerConfigError,
    CreateContainerError,
    RunContainerError,
    PostStartHookError,
    InvalidImageName,
    ImageInspectError,
    ErrImageNeverPull,
    ErrImagePull,
    ImagePullBackOff,
}

impl StartFailure {
    /// Upstream's reason string.
    pub fn reason(self) -> &'static str {
        match self {
            StartFailure::ContainerCreating => "ContainerCreating",
            StartFailure::CreatePodSandboxError => "CreatePodSandboxError",
            StartFailure::CreateContainerConfigError => "CreateContainerConfigError",
            StartFailure::CreateContainerError => "CreateContainerError",
            StartFailure::RunContainerError => "RunContainerError",
            StartFailure::PostStartHookError => "PostStartHookError",
            StartFailure::InvalidImageName => "InvalidImageName",
            StartFailure::ImageInspectError => "ImageInspectError",
            StartFailure::ErrImageNeverPull => "ErrImageNeverPull",
            StartFailure::ErrImagePull => "ErrImagePull",
            StartFailure::ImagePullBackOff => "ImagePullBackOff",
        }
    }

    /// Caused by the image (upstream's image manager errors), whose details the image puller
    /// has already reported in its own events.
    pub fn is_image(self) -> bool {
        matches!(
            self,
            StartFailure::ErrImagePull
                | StartFailure::ImagePullBackOff
                | StartFailure::ErrImageNeverPull
                | StartFailure::InvalidImageName
                | StartFailure::ImageInspectError
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_upstreams_and_image_failures_are_told_apart() {
        assert_eq!(StartFailure::CreateContainerConfigError.reason(), "CreateContainerConfigError");
        assert_eq!(StartFailure::ImagePullBackOff.reason(), "ImagePullBackOff");
        assert!(StartFailure::ErrImageNeverPull.is_image());
        assert!(!StartFailure::RunContainerError.is_image());
    }
}
