//! Making a container's image present, as upstream's image manager does: pull policy, per
//! pod-and-image backoff after failed pulls, pull secrets matched to the registry, the
//! node-wide pull limit, and the Pulling/Pulled/Failed/BackOff events with upstream messages.
//! The decisions live in the pure modules ([`super::credentials`], [`super::pull_backoff`]);
//! this is the edge to CRI and the API server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_cri::{CriError, ImageClient, api};
use gantry_pod::start_failure::StartFailure;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::credentials::{self, Credential, DockerConfig, Keyring};
use super::limiter::PullLimiter;
use super::pull_backoff::{self, PullBackoff};
use crate::cluster::objects::{ObjectError, ObjectSource};
use crate::events::{EventType, Recorder};
use gantry_config::format_std;
use gantry_pod::Nanos;
use gantry_vocab::spec::{self, PullPolicy};

/// Every pull attempt failed (one per matching credential); shown as the runtime's message,
/// or a bracketed list of them, as upstream.
#[derive(Debug, thiserror::Error)]
#[error("{}", match attempts.as_slice() { [one] => one.clone(), many => format!("[{}]", many.join(", ")) })]
struct PullError {
    attempts: Vec<String>,
}

/// Why an image pull secret cannot be used.
#[derive(Debug, thiserror::Error)]
enum SecretError {
    #[error("no API server to read it from")]
    NoApiServer,
    #[error(transparent)]
    Read(#[from] ObjectError),
    #[error("not found")]
    NotFound,
    #[error(transparent)]
    Parse(#[from] credentials::PullSecretError),
}

/// Why the image is not there, with the upstream waiting reason for the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullFailure {
    pub reason: StartFailure,
    pub message: String,
}

impl PullFailure {
    fn new(reason: StartFailure, message: impl Into<String>) -> Self {
        PullFailure { reason, message: message.into() }
    }
}

/// Shared by all pod workers (clones share the backoff and the pull limit).
#[derive(Clone)]
pub struct ImagePuller {
    images: ImageClient,
    limiter: PullLimiter,
    backoff: Arc<Mutex<PullBackoff>>,
    events: Recorder,
    /// Pull secrets come from the API server (cluster mode only).
    secrets: Option<ObjectSource>,
}

impl ImagePuller {
    pub fn new(images: ImageClient, parallel_pulls: Option<usize>) -> Self {
        ImagePuller {
            images,
            limiter: PullLimiter::new(parallel_pulls),
            backoff: Arc::default(),
            events: Recorder::default(),
            secrets: None,
        }
    }

    pub fn with_events(self, events: Recorder) -> Self {
        ImagePuller { events, ..self }
    }

    pub fn with_secrets(self, secrets: ObjectSource) -> Self {
        ImagePuller { secrets: Some(secrets), ..self }
    }

    /// How long pulls of `image` for `pod` are still backed off.
    pub fn backoff_remaining(&self, pod: &Pod, image: &str) -> Option<Duration> {
        let key = pull_backoff::key(spec::uid(pod), image);
        let backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        backoff.remaining(&key, now()).map(|(nanos, _)| Duration::from_nanos(nanos as u64))
    }

    /// Makes the container's image present as its pull policy says; returns the image as the
    /// runtime describes it (`None` if it could not say after a pull), so the start need not
    /// ask again for its user.
    pub async fn ensure_image(&self, pod: &Pod, c: &Container) -> Result<Option<api::Image>, PullFailure> {
        let image = c.image.as_deref().unwrap_or_default();
        let event = |kind, reason: &str, message: &str| self.events.record(pod, Some(&c.name), kind, reason, message);
        if let Err(e) = credentials::repository(image) {
            let message = format!("Failed to apply default image tag {image:?}: {e}");
            event(EventType::Warning, "InspectFailed", &message);
            return Err(PullFailure::new(StartFailure::InvalidImageName, message));
        }
        let policy = PullPolicy::of(c);
        if policy != PullPolicy::Always {
            let present = self.image_ref(image).await.map_err(|e| {
                let message = format!("Failed to inspect image {image:?}: {}", e.grpc_message());
                event(EventType::Warning, "InspectFailed", &message);
                PullFailure::new(StartFailure::ImageInspectError, message)
            })?;
            if present.is_some() {
                event(EventType::Normal, "Pulled", &format!("Container image {image:?} already present on machine"));
                return Ok(present);
            }
            if policy == PullPolicy::Never {
                let message = format!("Container image {image:?} is not present with pull policy of Never");
                event(EventType::Warning, "ErrImageNeverPull", &message);
                return Err(PullFailure::new(StartFailure::ErrImageNeverPull, message));
            }
        }
        let key = pull_backoff::key(spec::uid(pod), image);
        if let Some(previous) = self.backoff_error(&key) {
            let message = format!("Back-off pulling image {image:?}");
            event(EventType::Normal, "BackOff", &message);
            return Err(PullFailure::new(StartFailure::ImagePullBackOff, format!("{message}: {previous}")));
        }
        event(EventType::Normal, "Pulling", &format!("Pulling image {image:?}"));
        let asked = Instant::now();
        let keyring = Keyring::new(self.pull_secrets(pod).await);
        let permit = self.limiter.acquire().await;
        let started = Instant::now();
        let result = self.pull(image, keyring.lookup(image)).await;
        let pulled_in = started.elapsed();
        drop(permit);
        match result {
            Ok(image_ref) => {
                let pulled = self.image_ref(&image_ref).await.ok().flatten();
                let size = pulled.as_ref().map_or(0, |i| i.size);
                let message = format!(
                    "Successfully pulled image {image:?} in {} ({} including waiting). Image size: {size} bytes.",
                    format_millis(pulled_in),
                    format_millis(asked.elapsed()),
                );
                event(EventType::Normal, "Pulled", &message);
                self.backoff.lock().unwrap_or_else(|p| p.into_inner()).collect(now());
                Ok(pulled)
            }
            Err(error) => {
                let error = error.to_string();
                event(EventType::Warning, "Failed", &format!("Failed to pull image {image:?}: {error}"));
                let mut backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
                backoff.collect(now());
                backoff.failed(&key, now(), &error);
                Err(PullFailure::new(StartFailure::ErrImagePull, error))
            }
        }
    }

    /// The error that started the backoff of `key`, while it lasts.
    fn backoff_error(&self, key: &str) -> Option<String> {
        let backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        backoff.remaining(key, now()).map(|(_, error)| error.to_string())
    }

    async fn image_ref(&self, image: &str) -> Result<Option<api::Image>, CriError> {
        let spec = api::ImageSpec { image: image.to_string(), ..Default::default() };
        let status = self.images.image_status(api::ImageStatusRequest { image: Some(spec), verbose: false }).await?;
        Ok(status.image)
    }

    /// Pulls with each matching credential in turn until one works (anonymously when none
    /// matches), as upstream; the error lists every attempt's failure.
    async fn pull(&self, image: &str, credentials: Vec<Credential>) -> Result<String, PullError> {
        let auths: Vec<Option<api::AuthConfig>> = if credentials.is_empty() {
            vec![None]
        } else {
            credentials.into_iter().map(|c| Some(auth_config(c))).collect()
        };
        let mut errors = Vec::new();
        for auth in auths {
            let spec = api::ImageSpec { image: image.to_string(), ..Default::default() };
            let request = api::PullImageRequest { image: Some(spec), auth, sandbox_config: None };
            match self.images.pull_image(request).await {
                Ok(response) => return Ok(response.image_ref),
                Err(e) => errors.push(e.grpc_message()),
            }
        }
        Err(PullError { attempts: errors })
    }

    /// The docker configs of the pod's usable pull secrets. Secrets that are missing,
    /// unreadable or malformed are named in one `FailedToRetrieveImagePullSecret` event and
    /// skipped, so the other secrets (or an anonymous pull) still get their chance.
    async fn pull_secrets(&self, pod: &Pod) -> Vec<DockerConfig> {
        let names = pod.spec.as_ref().and_then(|s| s.image_pull_secrets.as_ref());
        let names = names.into_iter().flatten().map(|r| r.name.as_str()).filter(|n| !n.is_empty());
        let mut configs = Vec::new();
        let mut failed = Vec::new();
        for name in names {
            match self.secret(pod, name).await {
                Ok(config) => configs.push(config),
                Err(why) => {
                    tracing::warn!(pod = %spec::full_name(pod), secret = name, error = %why, "cannot use image pull secret");
                    failed.push(format!("{name} ({why})"));
                }
            }
        }
        if !failed.is_empty() {
            let message = format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                failed.join(", ")
            );
            self.events.record(pod, None, EventType::Warning, "FailedToRetrieveImagePullSecret", &message);
        }
        configs
    }

    async fn secret(&self, pod: &Pod, name: &str) -> Result<DockerConfig, SecretError> {
        let Some(source) = &self.secrets else { return Err(SecretError::NoApiServer) };
        match source.secret(pod, name).await? {
            Some(secret) => Ok(credentials::parse_secret(&secret)?),
            None => Err(SecretError::NotFound),
        }
    }
}

fn auth_config(c: Credential) -> api::AuthConfig {
    api::AuthConfig {
        username: c.username,
        password: c.password,
        identity_token: c.identity_token,
        registry_token: c.registry_token,
        ..Default::default()
    }
}

/// A duration truncated to milliseconds in Go syntax (`1.234s`, `56ms`).
fn format_millis(d: Duration) -> String {
    format_std(Duration::from_millis(d.as_millis() as u64))
}

fn now() -> Nanos {
    crate::clock::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_truncated_to_milliseconds_in_go_syntax() {
        assert_eq!(format_millis(Duration::from_micros(1_234_567)), "1.234s");
        assert_eq!(format_millis(Duration::from_micros(56_789)), "56ms");
        assert_eq!(format_millis(Duration::from_millis(62_500)), "1m2.5s");
        assert_eq!(format_millis(Duration::ZERO), "0s");
    }
}
