//! One `/containerLogs/{namespace}/{pod}/{container}` request: find the pod (404), the
//! container in its spec (404), the log of its current or previous instance (400 when there
//! is none, as upstream), then stream it from a blocking thread into a channel that the HTTP
//! body drains. When the client goes away the channel closes and the thread ends.

use std::io;
use std::path::{Path, PathBuf};

use gantry_cri::{RuntimeClient, api};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;

use gantry_logs::LogOptions;
use gantry_logs::reader::{self, FollowTiming, Liveness, Sink};
use gantry_vocab::cri_labels as labels;
use gantry_vocab::{paths, spec};

/// Why a log request cannot be served, with the HTTP status it maps to.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    #[error("pod {0:?} does not exist")]
    PodNotFound(String),
    #[error("container {container:?} not found in pod {pod:?}")]
    ContainerNotFound { container: String, pod: String },
    /// Upstream answers 400 for these (the log exists in principle but not now).
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Cri(#[from] gantry_cri::CriError),
}

impl LogsError {
    pub fn http_status(&self) -> u16 {
        match self {
            LogsError::PodNotFound(_) | LogsError::ContainerNotFound { .. } => 404,
            LogsError::Unavailable(_) => 400,
            LogsError::Cri(_) => 500,
        }
    }
}

/// A log ready to stream.
#[derive(Debug, Clone)]
pub struct Located {
    pub path: PathBuf,
    /// The instance, for follow mode's "is it still running" question.
    pub container_id: String,
    pub pod: String,
    pub container: String,
}

/// Finds the log file the request asks for.
pub async fn locate(
    pods: &[Pod],
    runtime: &RuntimeClient,
    node: &str,
    pod_logs_dir: &Path,
    (namespace, pod_name, container): (&str, &str, &str),
    opts: &LogOptions,
) -> Result<Located, LogsError> {
    let pod = find_pod(pods, namespace, pod_name).ok_or_else(|| LogsError::PodNotFound(pod_name.to_string()))?;
    if spec::any_container(&pod, container).is_none() {
        return Err(LogsError::ContainerNotFound { container: container.into(), pod: pod_name.into() });
    }
    if opts.previous {
        // Upstream decides from the pod's status alone: the instances may be gone already.
        let (path, id) = previous_instance(&pod, runtime, pod_logs_dir, pod_name, container).await?;
        return Ok(Located { path, container_id: id, pod: pod_name.into(), container: container.into() });
    }
    let selector = labels::container(node, pod_name, namespace, spec::uid(&pod), container);
    let filter = api::ContainerFilter { label_selector: selector, ..Default::default() };
    let mut instances = runtime.list_containers(api::ListContainersRequest { filter: Some(filter) }).await?.containers;
    instances.sort_by_key(|c| std::cmp::Reverse((c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at)));
    let Some(newest) = instances.first() else {
        return Err(LogsError::Unavailable(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start: {}",
            waiting_reason(&pod, container)
        )));
    };
    let attempt = newest.metadata.as_ref().map_or(0, |m| m.attempt);
    let path = reader::instance_log_path(&paths::pod_log_dir(pod_logs_dir, &pod), container, attempt);
    Ok(Located { path, container_id: newest.id.clone(), pod: pod_name.into(), container: container.into() })
}

/// The previous instance as upstream finds it (`validateContainerLogStatus`, then the
/// runtime's `GetContainerLogs`): the container of the status's `lastState.terminated`, its
/// log path from the runtime, and the same 400 answers when any of that is gone.
async fn previous_instance(
    pod: &Pod,
    runtime: &RuntimeClient,
    pod_logs_dir: &Path,
    pod_name: &str,
    container: &str,
) -> Result<(PathBuf, String), LogsError> {
    let Some(full_id) = last_terminated_id(pod, container) else {
        return Err(LogsError::Unavailable(format!(
            "previous terminated container {container:?} in pod {pod_name:?} not found"
        )));
    };
    let id = full_id.split_once("://").map_or(full_id.as_str(), |(_, id)| id).to_string();
    let req = api::ContainerStatusRequest { container_id: id.clone(), verbose: false };
    let status = match runtime.container_status(req).await {
        Ok(resp) => resp.status,
        Err(e) => {
            tracing::debug!(pod = %pod_name, container, container_id = %full_id, error = %e, "ContainerStatus failed");
            return Err(LogsError::Unavailable(format!("unable to retrieve container logs for {full_id}")));
        }
    };
    // Upstream's `ErrContainerStatusNil`: the runtime answered without a status.
    let Some(status) = status else { return Err(LogsError::Unavailable("container status is nil".into())) };
    // containerd reports the full path; a relative one is below the pod's log directory.
    let path = paths::pod_log_dir(pod_logs_dir, pod).join(&status.log_path);
    if let Some(missing) = first_missing(&path) {
        return Err(LogsError::Unavailable(format!(
            "failed to try resolving symlinks in path {:?}: lstat {}: no such file or directory",
            path.display().to_string(),
            missing.display()
        )));
    }
    Ok((path, id))
}

/// `lastState.terminated.containerID` of the container (regular, init or ephemeral).
fn last_terminated_id(pod: &Pod, container: &str) -> Option<String> {
    let status = pod.status.as_ref()?;
    [&status.container_statuses, &status.init_container_statuses, &status.ephemeral_container_statuses]
        .into_iter()
        .flatten()
        .flatten()
        .find(|s| s.name == container)?
        .last_state
        .as_ref()?
        .terminated
        .as_ref()?
        .container_id
        .clone()
        .filter(|id| !id.is_empty())
}

/// The first component of `path` that does not exist (what Go's `EvalSymlinks` fails on).
fn first_missing(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find(|p| std::fs::symlink_metadata(p).is_err())
        .map(Path::to_path_buf)
}

fn find_pod(pods: &[Pod], namespace: &str, name: &str) -> Option<Pod> {
    pods.iter().find(|p| spec::namespace(p) == namespace && spec::name(p) == name).cloned()
}

fn waiting_reason(pod: &Pod, container: &str) -> String {
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    statuses
        .and_then(|all| all.iter().find(|s| s.name == container))
        .and_then(|s| s.state.as_ref()?.waiting.as_ref()?.reason.clone())
        .unwrap_or_else(|| "ContainerCreating".into())
}

pub type Chunk = Result<Vec<u8>, io::Error>;

/// Starts streaming `log` into a channel; the receiver is the response body.
pub fn spawn_stream(log: Located, opts: LogOptions, runtime: RuntimeClient) -> mpsc::Receiver<Chunk> {
    let (tx, rx) = mpsc::channel::<Chunk>(16);
    let handle = tokio::runtime::Handle::current();
    let now = Timestamp::now();
    tokio::task::spawn_blocking(move || {
        let mut sink = ChannelSink(tx.clone());
        let mut alive = CriLiveness { runtime, handle, id: log.container_id.clone() };
        let result = reader::stream(&log.path, &opts, now, &mut sink, &mut alive, FollowTiming::default());
        match result {
            Ok(end) => {
                tracing::debug!(pod = %log.pod, container = %log.container, ?end, "container log stream ended")
            }
            Err(e) => {
                tracing::warn!(pod = %log.pod, container = %log.container, error = %e, "cannot read container log");
                let _ = tx.blocking_send(Err(e));
            }
        }
    });
    rx
}

struct ChannelSink(mpsc::Sender<Chunk>);

impl Sink for ChannelSink {
    fn write(&mut self, bytes: &[u8]) -> bool {
        self.0.blocking_send(Ok(bytes.to_vec())).is_ok()
    }
    fn closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// Asks the runtime whether the followed instance still runs.
struct CriLiveness {
    runtime: RuntimeClient,
    handle: tokio::runtime::Handle,
    id: String,
}

impl Liveness for CriLiveness {
    fn running(&mut self) -> bool {
        if self.id.is_empty() {
            return false;
        }
        let req = api::ContainerStatusRequest { container_id: self.id.clone(), verbose: false };
        match self.handle.block_on(self.runtime.container_status(req)) {
            Ok(resp) => resp.status.is_some_and(|s| s.state == api::ContainerState::ContainerRunning as i32),
            // Gone: nothing will write to its log any more. Other errors: keep following.
            Err(e) => !e.is_not_found(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_missing_component_is_what_lstat_names() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("default_p_uid");
        assert_eq!(first_missing(&gone.join("main/0.log")), Some(gone.clone()));
        std::fs::create_dir_all(gone.join("main")).unwrap();
        std::fs::write(gone.join("main/0.log"), "").unwrap();
        assert_eq!(first_missing(&gone.join("main/0.log")), None);
    }

    #[test]
    fn previous_instance_from_last_state() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {
                "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": false, "restartCount": 1,
                    "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://abc"}}}],
                "initContainerStatuses": [{"name": "init", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                    "lastState": {}}]
            }
        }))
        .unwrap();
        assert_eq!(last_terminated_id(&pod, "main").as_deref(), Some("containerd://abc"));
        assert_eq!(last_terminated_id(&pod, "init"), None);
        assert_eq!(last_terminated_id(&pod, "other"), None);
    }
}
