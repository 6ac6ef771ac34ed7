//! A scriptable in-process CRI runtime for fast agent tests: `RuntimeService` and
//! `ImageService` on a unix socket, with sandboxes, containers and images in memory.
//!
//! The socket is the seam: the agent under test talks to it exactly as to containerd. A test
//! scripts it (a container exits with a code, a call fails with a gRPC code or hangs until
//! released, an `ExecSync` answers with a result) and reads back the calls it received.
//!
//! Time: every timestamp and call time comes from tokio's clock, so under a paused clock the
//! runtime and the agent share one virtual time. Auto-advance jumps the paused clock to the next
//! timer whenever the runtime waits, also while a gRPC call is in flight, so timing tests hold
//! the clock with [`ManualClock`] and step it with [`FakeCri::advance`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gantry_cri::api::image_service_server::{ImageService, ImageServiceServer};
use gantry_cri::api::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use gantry_cri::api::*;
use tokio::sync::watch;
/// The gRPC status code a scripted failure answers with (re-exported so tests need no gRPC crate).
pub use tonic::Code;
use tonic::{Request, Response, Status};

/// The sandbox label upstream's kubelet (and Gantry) puts the pod's UID in.
const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// What the fake calls itself in `Version`.
pub const RUNTIME_NAME: &str = "fake-cri";

/// One call the fake received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The CRI method, as upstream names it (`RunPodSandbox`, `CreateContainer`, …).
    pub op: &'static str,
    /// The pod (sandbox metadata name) the call is about; empty for node-wide calls.
    /// `ListPodSandbox` names the pod its label selector picks by UID, if any.
    pub pod: String,
    /// The container (metadata name) the call is about; empty if none.
    pub container: String,
    /// The pod UID a list's label selector picks, if any: also before the pod has a sandbox
    /// (and so a name here).
    pub uid: String,
    /// When it arrived, on tokio's clock.
    pub at: tokio::time::Instant,
}

/// A running fake; stops serving when dropped.
pub struct FakeCri {
    socket: PathBuf,
    state: Arc<Mutex<State>>,
    /// Bumped on every call and every change a test scripts; hung calls wait on it.
    changed: watch::Sender<u64>,
    server: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    sandboxes: Vec<PodSandboxStatus>,
    containers: Vec<ContainerStatus>,
    /// Container ID → sandbox ID.
    sandbox_of: HashMap<String, String>,
    images: Vec<Image>,
    calls: Vec<Call>,
    /// Calls being answered now (hung calls not counted).
    in_progress: usize,
    rules: Vec<Rule>,
    /// Container name → exit code it exits with as soon as it starts.
    exit_on_start: HashMap<String, i32>,
    /// Container name → what `ExecSync` in it answers.
    exec: HashMap<String, ExecSyncResponse>,
    /// Where `ImageFsInfo` says the images are: the socket's directory, a real filesystem.
    image_fs: PathBuf,
}

#[derive(Clone)]
struct Rule {
    op: String,
    pod: Option<String>,
    effect: Effect,
}

#[derive(Clone)]
enum Effect {
    Fail(Code),
    Hang,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Nanoseconds since the epoch on tokio's clock (the system time unless tokio's clock is
/// paused), as the agent reads it, so the runtime's timestamps and the agent's "now" agree.
fn now_nanos() -> i64 {
    let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as i128;
    let (tokio_now, std_now) = (tokio::time::Instant::now().into_std(), std::time::Instant::now());
    let skew = match tokio_now.checked_duration_since(std_now) {
        Some(ahead) => ahead.as_nanos() as i128,
        None => -(std_now.duration_since(tokio_now).as_nanos() as i128),
    };
    (wall + skew) as i64
}

impl FakeCri {
    /// Serves both CRI services on `socket` (replacing a stale socket file).
    pub async fn start(socket: &Path) -> crate::Result<Self> {
        let image_fs = socket.parent().unwrap_or(Path::new("/")).to_path_buf();
        let state = Arc::new(Mutex::new(State { image_fs, ..State::default() }));
        let changed = watch::Sender::new(0);
        let service = Service { state: state.clone(), changed: changed.clone() };
        let incoming = crate::cri::serve_socket(socket)?;
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(service.clone()))
                .add_service(ImageServiceServer::new(service))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "fake CRI server stopped");
            }
        });
        Ok(FakeCri { socket: socket.to_path_buf(), state, changed, server })
    }

    /// `unix://` endpoint for `--container-runtime-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    fn touch(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Makes `image` present, as if pulled before.
    pub fn add_image(&self, image: &str) {
        add_image(&mut lock(&self.state), image);
        self.touch();
    }

    /// Every `op` call about `pod` (any pod if `None`) fails with `code` until [`Self::clear`].
    pub fn fail(&self, op: &str, pod: Option<&str>, code: Code) {
        self.add_rule(op, pod, Effect::Fail(code));
    }

    /// Every `op` call about `pod` (any pod if `None`) waits, unanswered, until
    /// [`Self::clear`] (the caller's own deadline may end it first).
    pub fn hang(&self, op: &str, pod: Option<&str>) {
        self.add_rule(op, pod, Effect::Hang);
    }

    fn add_rule(&self, op: &str, pod: Option<&str>, effect: Effect) {
        lock(&self.state).rules.push(Rule { op: op.to_string(), pod: pod.map(str::to_string), effect });
        self.touch();
    }

    /// Drops every failure and hang scripted for `op`; hung calls go on.
    pub fn clear(&self, op: &str) {
        lock(&self.state).rules.retain(|r| r.op != op);
        self.touch();
    }

    /// Containers named `container` exit with `code` as soon as they start.
    pub fn exit_on_start(&self, container: &str, code: i32) {
        lock(&self.state).exit_on_start.insert(container.to_string(), code);
        self.touch();
    }

    /// The running container `container` of `pod` exits with `code` now. Returns false if no
    /// such container runs.
    pub fn exit(&self, pod: &str, container: &str, code: i32) -> bool {
        let mut state = lock(&self.state);
        let id = state.running_container(pod, container);
        let found = id.as_ref().is_some_and(|id| state.finish(id, code));
        drop(state);
        self.touch();
        found
    }

    /// What `ExecSync` in containers named `container` answers (default: exit code 0, no output).
    pub fn set_exec_result(&self, container: &str, result: ExecSyncResponse) {
        lock(&self.state).exec.insert(container.to_string(), result);
        self.touch();
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.state).calls.clone()
    }

    /// The calls of `op` received so far, in order.
    pub fn calls_of(&self, op: &str) -> Vec<Call> {
        lock(&self.state).calls.iter().filter(|c| c.op == op).cloned().collect()
    }

    /// The containers the fake holds now.
    pub fn containers(&self) -> Vec<ContainerStatus> {
        lock(&self.state).containers.clone()
    }

    /// The images the fake holds now.
    pub fn images(&self) -> Vec<Image> {
        lock(&self.state).images.clone()
    }

    /// The sandboxes the fake holds now.
    pub fn sandboxes(&self) -> Vec<PodSandboxStatus> {
        lock(&self.state).sandboxes.clone()
    }

    /// Waits (on real time, `limit` at most) until `check` holds for the calls received;
    /// returns whether it did. Works with a paused clock too.
    pub async fn wait_for_calls(&self, limit: Duration, check: impl Fn(&[Call]) -> bool) -> bool {
        let mut changes = self.changed.subscribe();
        let deadline = std::time::Instant::now() + limit;
        loop {
            if check(&lock(&self.state).calls) {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else { return false };
            // A real-time bound: under a paused clock, tokio's timers would not fire.
            let bound = tokio::task::spawn_blocking(move || std::thread::sleep(left.min(Duration::from_millis(20))));
            tokio::select! {
                _ = changes.changed() => {}
                _ = bound => {}
            }
        }
    }

    /// Waits until no call is being answered and none arrived over two rounds of letting every
    /// ready task run and a few real milliseconds pass: the agent has done what it could do at
    /// this instant of (paused) time.
    pub async fn settle(&self) {
        let mut seen = usize::MAX;
        let mut quiet_rounds = 0;
        while quiet_rounds < 2 {
            // Yielding lets every task that is ready run, and the I/O driver deliver what the
            // socket already holds, before we look.
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            real_sleep(Duration::from_millis(3)).await;
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            let (calls, busy) = {
                let state = lock(&self.state);
                (state.calls.len(), state.in_progress)
            };
            quiet_rounds = if calls == seen && busy == 0 { quiet_rounds + 1 } else { 0 };
            seen = calls;
        }
    }

    /// Moves a clock held by [`ManualClock`] forward by `by`, in steps of 100 ms, letting the
    /// agent settle before each step, so a CRI call takes no virtual time (up to a step when the
    /// agent is slow) and every timer fires at its virtual deadline.
    pub async fn advance(&self, by: Duration) {
        const STEP: Duration = Duration::from_millis(100);
        let mut left = by;
        while !left.is_zero() {
            self.settle().await;
            let step = left.min(STEP);
            tokio::time::advance(step).await;
            left -= step;
        }
        self.settle().await;
    }

    /// Steps the clock as [`Self::advance`] until `check` holds for the calls received, `limit`
    /// of virtual time at most; returns whether it did.
    pub async fn advance_until(&self, limit: Duration, check: impl Fn(&[Call]) -> bool) -> bool {
        let start = tokio::time::Instant::now();
        loop {
            self.settle().await;
            if check(&lock(&self.state).calls) {
                return true;
            }
            if start.elapsed() >= limit {
                return false;
            }
            tokio::time::advance(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for FakeCri {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn real_sleep(d: Duration) {
    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(d)).await;
}

/// Holds tokio's paused clock still (no auto-advance) while it lives, so that only
/// [`FakeCri::advance`] moves it. Auto-advance would otherwise jump to the next timer while a
/// gRPC call waits for the socket, making every call take up to a timer period of virtual time.
pub struct ManualClock {
    release: Option<std::sync::mpsc::Sender<()>>,
}

impl ManualClock {
    /// Call in a `current_thread` runtime whose clock is paused.
    pub fn hold() -> Self {
        let (release, held) = std::sync::mpsc::channel::<()>();
        // A running blocking task inhibits auto-advance (documented at `tokio::time::pause`).
        tokio::task::spawn_blocking(move || {
            let _ = held.recv();
        });
        ManualClock { release: Some(release) }
    }
}

impl Drop for ManualClock {
    fn drop(&mut self) {
        self.release.take();
    }
}

fn add_image(state: &mut State, image: &str) {
    if find_image(state, image).is_none() {
        state.next_id += 1;
        let id = format!("sha256:{:064x}", state.next_id);
        state.images.push(Image { id, repo_tags: vec![image.to_string()], size: 1024 * 1024, ..Default::default() });
    }
}

fn find_image<'a>(state: &'a State, image: &str) -> Option<&'a Image> {
    state.images.iter().find(|i| i.id == image || i.repo_tags.iter().any(|t| t == image))
}

fn labels_match(selector: &HashMap<String, String>, labels: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn not_found(kind: &str, id: &str) -> Status {
    Status::not_found(format!("an error occurred when try to find {kind} {id:?}: not found"))
}

impl State {
    /// The pod a label selector picks by its UID (a pod worker's own listing), else empty (a
    /// node-wide relist).
    fn pod_selected(&self, selector: &HashMap<String, String>) -> String {
        let Some(uid) = selector.get(POD_UID_LABEL) else { return String::new() };
        let sandbox = self.sandboxes.iter().find(|s| s.labels.get(POD_UID_LABEL) == Some(uid));
        sandbox.and_then(|s| s.metadata.as_ref()).map(|m| m.name.clone()).unwrap_or_default()
    }

    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{:016x}", self.next_id)
    }

    fn sandbox(&self, id: &str) -> Option<&PodSandboxStatus> {
        self.sandboxes.iter().find(|s| s.id == id)
    }

    fn container(&self, id: &str) -> Option<&ContainerStatus> {
        self.containers.iter().find(|c| c.id == id)
    }

    fn pod_of_sandbox(&self, id: &str) -> String {
        self.sandbox(id).and_then(|s| s.metadata.as_ref()).map(|m| m.name.clone()).unwrap_or_default()
    }

    /// (pod, container) names of a container ID.
    fn names_of_container(&self, id: &str) -> (String, String) {
        let pod = self.sandbox_of.get(id).map(|s| self.pod_of_sandbox(s)).unwrap_or_default();
        let name = self.container(id).and_then(|c| c.metadata.as_ref()).map(|m| m.name.clone()).unwrap_or_default();
        (pod, name)
    }

    fn running_container(&self, pod: &str, container: &str) -> Option<String> {
        self.containers
            .iter()
            .filter(|c| c.state == ContainerState::ContainerRunning as i32)
            .find(|c| {
                c.metadata.as_ref().is_some_and(|m| m.name == container) && self.names_of_container(&c.id).0 == pod
            })
            .map(|c| c.id.clone())
    }

    /// The container exits with `code`; false if it was not running.
    fn finish(&mut self, id: &str, code: i32) -> bool {
        let now = now_nanos();
        let Some(c) = self.containers.iter_mut().find(|c| c.id == id) else { return false };
        if c.state != ContainerState::ContainerRunning as i32 {
            return false;
        }
        c.state = ContainerState::ContainerExited as i32;
        c.finished_at = now;
        c.exit_code = code;
        c.reason = if code == 0 { "Completed" } else { "Error" }.to_string();
        true
    }

    fn rule(&self, op: &str, pod: &str) -> Option<Effect> {
        self.rules.iter().find(|r| r.op == op && r.pod.as_deref().is_none_or(|p| p == pod)).map(|r| r.effect.clone())
    }
}

#[derive(Clone)]
struct Service {
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
}

/// Marks a call as answered when dropped (also when the caller gives up on it).
struct InProgress<'a>(&'a Service);

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).in_progress -= 1;
        self.0.changed.send_modify(|v| *v += 1);
    }
}

impl Service {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Logs the call and applies the scripted failure or hang, if any. The returned guard
    /// marks the call as in progress until the handler returns.
    async fn enter(&self, op: &'static str, pod: String, container: String) -> Result<InProgress<'_>, Status> {
        self.enter_selecting(op, pod, container, String::new()).await
    }

    /// [`Service::enter`] for a list whose selector picks the pod with `uid`.
    async fn enter_selecting(
        &self,
        op: &'static str,
        pod: String,
        container: String,
        uid: String,
    ) -> Result<InProgress<'_>, Status> {
        let effect = {
            let mut state = self.lock();
            let effect = state.rule(op, &pod);
            let at = tokio::time::Instant::now();
            state.calls.push(Call { op, pod: pod.clone(), container, uid, at });
            effect
        };
        self.changed.send_modify(|v| *v += 1);
        match effect {
            Some(Effect::Fail(code)) => return Err(Status::new(code, format!("fake: {op} fails as scripted"))),
            Some(Effect::Hang) => {
                let mut changes = self.changed.subscribe();
                while matches!(self.lock().rule(op, &pod), Some(Effect::Hang)) {
                    if changes.changed().await.is_err() {
                        break;
                    }
                }
            }
            None => {}
        }
        self.lock().in_progress += 1;
        Ok(InProgress(self))
    }

    /// For calls about one container: its pod and name, after logging the call.
    async fn enter_container(&self, op: &'static str, id: &str) -> Result<InProgress<'_>, Status> {
        let (pod, name) = self.lock().names_of_container(id);
        self.enter(op, pod, name).await
    }
}

fn unimplemented<T>(op: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!("fake CRI does not implement {op}")))
}

#[tonic::async_trait]
impl RuntimeService for Service {
    async fn version(&self, _: Request<VersionRequest>) -> Result<Response<VersionResponse>, Status> {
        let _call = self.enter("Version", String::new(), String::new()).await?;
        Ok(Response::new(VersionResponse {
            version: "0.1.0".into(),
            runtime_name: RUNTIME_NAME.into(),
            runtime_version: "1.0.0".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<RunPodSandboxRequest>,
    ) -> Result<Response<RunPodSandboxResponse>, Status> {
        let config = request.into_inner().config.unwrap_or_default();
        let metadata = config.metadata.clone().unwrap_or_default();
        let _call = self.enter("RunPodSandbox", metadata.name.clone(), String::new()).await?;
        let mut state = self.lock();
        let id = state.id("sandbox-");
        let ip = format!("10.88.0.{}", state.sandboxes.len() % 250 + 2);
        state.sandboxes.push(PodSandboxStatus {
            id: id.clone(),
            metadata: Some(metadata),
            state: PodSandboxState::SandboxReady as i32,
            created_at: now_nanos(),
            network: Some(PodSandboxNetworkStatus { ip, additional_ips: Vec::new() }),
            labels: config.labels,
            annotations: config.annotations,
            ..Default::default()
        });
        Ok(Response::new(RunPodSandboxResponse { pod_sandbox_id: id }))
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<StopPodSandboxRequest>,
    ) -> Result<Response<StopPodSandboxResponse>, Status> {
        let id = request.into_inner().pod_sandbox_id;
        let pod = self.lock().pod_of_sandbox(&id);
        let _call = self.enter("StopPodSandbox", pod, String::new()).await?;
        let mut state = self.lock();
        let Some(sandbox) = state.sandboxes.iter_mut().find(|s| s.id == id) else {
            return Err(not_found("sandbox", &id));
        };
        sandbox.state = PodSandboxState::SandboxNotready as i32;
        let members: Vec<String> = state.sandbox_of.iter().filter(|(_, s)| **s == id).map(|(c, _)| c.clone()).collect();
        for c in members {
            state.finish(&c, 137);
        }
        Ok(Response::new(StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<RemovePodSandboxRequest>,
    ) -> Result<Response<RemovePodSandboxResponse>, Status> {
        let id = request.into_inner().pod_sandbox_id;
        let pod = self.lock().pod_of_sandbox(&id);
        let _call = self.enter("RemovePodSandbox", pod, String::new()).await?;
        let mut state = self.lock();
        let State { sandboxes, containers, sandbox_of, .. } = &mut *state;
        sandboxes.retain(|s| s.id != id);
        containers.retain(|c| sandbox_of.get(&c.id) != Some(&id));
        sandbox_of.retain(|_, s| *s != id);
        Ok(Response::new(RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<PodSandboxStatusRequest>,
    ) -> Result<Response<PodSandboxStatusResponse>, Status> {
        let id = request.into_inner().pod_sandbox_id;
        let pod = self.lock().pod_of_sandbox(&id);
        let _call = self.enter("PodSandboxStatus", pod, String::new()).await?;
        let status = self.lock().sandbox(&id).cloned().ok_or_else(|| not_found("sandbox", &id))?;
        Ok(Response::new(PodSandboxStatusResponse { status: Some(status), ..Default::default() }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        let filter = request.into_inner().filter.unwrap_or_default();
        let pod = self.lock().pod_selected(&filter.label_selector);
        let uid = filter.label_selector.get(POD_UID_LABEL).cloned().unwrap_or_default();
        let _call = self.enter_selecting("ListPodSandbox", pod, String::new(), uid).await?;
        let items = self
            .lock()
            .sandboxes
            .iter()
            .filter(|s| filter.id.is_empty() || s.id == filter.id)
            .filter(|s| filter.state.as_ref().is_none_or(|v| v.state == s.state))
            .filter(|s| labels_match(&filter.label_selector, &s.labels))
            .map(|s| PodSandbox {
                id: s.id.clone(),
                metadata: s.metadata.clone(),
                state: s.state,
                created_at: s.created_at,
                labels: s.labels.clone(),
                annotations: s.annotations.clone(),
                runtime_handler: s.runtime_handler.clone(),
            })
            .collect();
        Ok(Response::new(ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        request: Request<CreateContainerRequest>,
    ) -> Result<Response<CreateContainerResponse>, Status> {
        let request = request.into_inner();
        let config = request.config.unwrap_or_default();
        let metadata = config.metadata.clone().unwrap_or_default();
        let pod = self.lock().pod_of_sandbox(&request.pod_sandbox_id);
        let _call = self.enter("CreateContainer", pod, metadata.name.clone()).await?;
        let mut state = self.lock();
        if state.sandbox(&request.pod_sandbox_id).is_none() {
            return Err(not_found("sandbox", &request.pod_sandbox_id));
        }
        let image = config.image.clone().unwrap_or_default();
        let Some(image_id) = find_image(&state, &image.image).map(|i| i.id.clone()) else {
            return Err(Status::not_found(format!("failed to get image {:?}: not found", image.image)));
        };
        let id = state.id("container-");
        state.sandbox_of.insert(id.clone(), request.pod_sandbox_id.clone());
        let (user, resources) = reported_identity_and_resources(&config);
        state.containers.push(ContainerStatus {
            id: id.clone(),
            metadata: Some(metadata),
            state: ContainerState::ContainerCreated as i32,
            created_at: now_nanos(),
            image: Some(image),
            image_ref: image_id.clone(),
            image_id,
            labels: config.labels,
            annotations: config.annotations,
            mounts: config.mounts,
            log_path: config.log_path,
            user,
            resources,
            ..Default::default()
        });
        Ok(Response::new(CreateContainerResponse { container_id: id }))
    }

    async fn start_container(
        &self,
        request: Request<StartContainerRequest>,
    ) -> Result<Response<StartContainerResponse>, Status> {
        let id = request.into_inner().container_id;
        let _call = self.enter_container("StartContainer", &id).await?;
        let mut state = self.lock();
        let exit_code = {
            let Some(c) = state.containers.iter_mut().find(|c| c.id == id) else {
                return Err(not_found("container", &id));
            };
            if c.state != ContainerState::ContainerCreated as i32 {
                return Err(Status::failed_precondition(format!("container {id} is not in created state")));
            }
            c.state = ContainerState::ContainerRunning as i32;
            c.started_at = now_nanos();
            let name = c.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
            state.exit_on_start.get(&name).copied()
        };
        if let Some(code) = exit_code {
            state.finish(&id, code);
        }
        Ok(Response::new(StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        request: Request<StopContainerRequest>,
    ) -> Result<Response<StopContainerResponse>, Status> {
        let id = request.into_inner().container_id;
        let _call = self.enter_container("StopContainer", &id).await?;
        let mut state = self.lock();
        if state.container(&id).is_none() {
            return Err(not_found("container", &id));
        }
        state.finish(&id, 137);
        Ok(Response::new(StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        request: Request<RemoveContainerRequest>,
    ) -> Result<Response<RemoveContainerResponse>, Status> {
        let id = request.into_inner().container_id;
        let _call = self.enter_container("RemoveContainer", &id).await?;
        let mut state = self.lock();
        state.containers.retain(|c| c.id != id);
        state.sandbox_of.remove(&id);
        Ok(Response::new(RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        request: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        let filter = request.into_inner().filter.unwrap_or_default();
        let _call = self.enter("ListContainers", String::new(), String::new()).await?;
        let state = self.lock();
        let containers = state
            .containers
            .iter()
            .filter(|c| filter.id.is_empty() || c.id == filter.id)
            .filter(|c| filter.pod_sandbox_id.is_empty() || state.sandbox_of.get(&c.id) == Some(&filter.pod_sandbox_id))
            .filter(|c| filter.state.as_ref().is_none_or(|v| v.state == c.state))
            .filter(|c| labels_match(&filter.label_selector, &c.labels))
            .map(|c| Container {
                id: c.id.clone(),
                pod_sandbox_id: state.sandbox_of.get(&c.id).cloned().unwrap_or_default(),
                metadata: c.metadata.clone(),
                image: c.image.clone(),
                image_ref: c.image_ref.clone(),
                state: c.state,
                created_at: c.created_at,
                labels: c.labels.clone(),
                annotations: c.annotations.clone(),
                image_id: c.image_id.clone(),
            })
            .collect();
        Ok(Response::new(ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        request: Request<ContainerStatusRequest>,
    ) -> Result<Response<ContainerStatusResponse>, Status> {
        let id = request.into_inner().container_id;
        let _call = self.enter_container("ContainerStatus", &id).await?;
        let status = self.lock().container(&id).cloned().ok_or_else(|| not_found("container", &id))?;
        Ok(Response::new(ContainerStatusResponse { status: Some(status), ..Default::default() }))
    }

    async fn exec_sync(&self, request: Request<ExecSyncRequest>) -> Result<Response<ExecSyncResponse>, Status> {
        let id = request.into_inner().container_id;
        let _call = self.enter_container("ExecSync", &id).await?;
        let state = self.lock();
        let c = state.container(&id).ok_or_else(|| not_found("container", &id))?;
        if c.state != ContainerState::ContainerRunning as i32 {
            return Err(Status::unknown(format!("container {id} is not running")));
        }
        let name = c.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or_default();
        Ok(Response::new(state.exec.get(name).cloned().unwrap_or_default()))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let _call = self.enter("Status", String::new(), String::new()).await?;
        let condition = |kind: &str| RuntimeCondition { r#type: kind.to_string(), status: true, ..Default::default() };
        let status = RuntimeStatus { conditions: vec![condition("RuntimeReady"), condition("NetworkReady")] };
        Ok(Response::new(StatusResponse { status: Some(status), ..Default::default() }))
    }

    async fn reopen_container_log(
        &self,
        request: Request<ReopenContainerLogRequest>,
    ) -> Result<Response<ReopenContainerLogResponse>, Status> {
        let id = request.into_inner().container_id;
        let _call = self.enter_container("ReopenContainerLog", &id).await?;
        Ok(Response::new(ReopenContainerLogResponse {}))
    }

    /// Applies the new Linux resources: the container reports them from then on.
    async fn update_container_resources(
        &self,
        request: Request<UpdateContainerResourcesRequest>,
    ) -> Result<Response<UpdateContainerResourcesResponse>, Status> {
        let request = request.into_inner();
        let _call = self.enter_container("UpdateContainerResources", &request.container_id).await?;
        let mut state = self.lock();
        let Some(c) = state.containers.iter_mut().find(|c| c.id == request.container_id) else {
            return Err(not_found("container", &request.container_id));
        };
        c.resources = request.linux.map(|l| ContainerResources { linux: Some(l), ..Default::default() });
        Ok(Response::new(UpdateContainerResourcesResponse {}))
    }

    async fn exec(&self, _: Request<ExecRequest>) -> Result<Response<ExecResponse>, Status> {
        unimplemented("Exec")
    }

    async fn attach(&self, _: Request<AttachRequest>) -> Result<Response<AttachResponse>, Status> {
        unimplemented("Attach")
    }

    async fn port_forward(&self, _: Request<PortForwardRequest>) -> Result<Response<PortForwardResponse>, Status> {
        unimplemented("PortForward")
    }

    async fn container_stats(
        &self,
        _: Request<ContainerStatsRequest>,
    ) -> Result<Response<ContainerStatsResponse>, Status> {
        unimplemented("ContainerStats")
    }

    async fn list_container_stats(
        &self,
        _: Request<ListContainerStatsRequest>,
    ) -> Result<Response<ListContainerStatsResponse>, Status> {
        unimplemented("ListContainerStats")
    }

    async fn pod_sandbox_stats(
        &self,
        _: Request<PodSandboxStatsRequest>,
    ) -> Result<Response<PodSandboxStatsResponse>, Status> {
        unimplemented("PodSandboxStats")
    }

    async fn list_pod_sandbox_stats(
        &self,
        _: Request<ListPodSandboxStatsRequest>,
    ) -> Result<Response<ListPodSandboxStatsResponse>, Status> {
        unimplemented("ListPodSandboxStats")
    }

    async fn update_runtime_config(
        &self,
        _: Request<UpdateRuntimeConfigRequest>,
    ) -> Result<Response<UpdateRuntimeConfigResponse>, Status> {
        unimplemented("UpdateRuntimeConfig")
    }

    async fn checkpoint_container(
        &self,
        _: Request<CheckpointContainerRequest>,
    ) -> Result<Response<CheckpointContainerResponse>, Status> {
        unimplemented("CheckpointContainer")
    }

    type GetContainerEventsStream = futures::stream::Empty<Result<ContainerEventResponse, Status>>;

    async fn get_container_events(
        &self,
        _: Request<GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        unimplemented("GetContainerEvents")
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<ListMetricDescriptorsRequest>,
    ) -> Result<Response<ListMetricDescriptorsResponse>, Status> {
        unimplemented("ListMetricDescriptors")
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<ListPodSandboxMetricsRequest>,
    ) -> Result<Response<ListPodSandboxMetricsResponse>, Status> {
        unimplemented("ListPodSandboxMetrics")
    }

    async fn runtime_config(
        &self,
        _: Request<RuntimeConfigRequest>,
    ) -> Result<Response<RuntimeConfigResponse>, Status> {
        unimplemented("RuntimeConfig")
    }
}

#[tonic::async_trait]
impl ImageService for Service {
    async fn list_images(&self, _: Request<ListImagesRequest>) -> Result<Response<ListImagesResponse>, Status> {
        let _call = self.enter("ListImages", String::new(), String::new()).await?;
        Ok(Response::new(ListImagesResponse { images: self.lock().images.clone() }))
    }

    async fn image_status(
        &self,
        request: Request<ImageStatusRequest>,
    ) -> Result<Response<ImageStatusResponse>, Status> {
        let image = request.into_inner().image.unwrap_or_default().image;
        let _call = self.enter("ImageStatus", String::new(), String::new()).await?;
        let found = find_image(&self.lock(), &image).cloned();
        Ok(Response::new(ImageStatusResponse { image: found, ..Default::default() }))
    }

    async fn pull_image(&self, request: Request<PullImageRequest>) -> Result<Response<PullImageResponse>, Status> {
        let request = request.into_inner();
        let image = request.image.unwrap_or_default().image;
        let pod = request.sandbox_config.and_then(|c| c.metadata).map(|m| m.name).unwrap_or_default();
        let _call = self.enter("PullImage", pod, String::new()).await?;
        let mut state = self.lock();
        add_image(&mut state, &image);
        let image_ref = find_image(&state, &image).map(|i| i.id.clone()).unwrap_or_default();
        Ok(Response::new(PullImageResponse { image_ref }))
    }

    async fn remove_image(
        &self,
        request: Request<RemoveImageRequest>,
    ) -> Result<Response<RemoveImageResponse>, Status> {
        let image = request.into_inner().image.unwrap_or_default().image;
        let _call = self.enter("RemoveImage", String::new(), String::new()).await?;
        let mut state = self.lock();
        let id = find_image(&state, &image).map(|i| i.id.clone());
        state.images.retain(|i| Some(&i.id) != id.as_ref());
        Ok(Response::new(RemoveImageResponse {}))
    }

    async fn image_fs_info(&self, _: Request<ImageFsInfoRequest>) -> Result<Response<ImageFsInfoResponse>, Status> {
        let _call = self.enter("ImageFsInfo", String::new(), String::new()).await?;
        let mountpoint = self.lock().image_fs.display().to_string();
        let fs = FilesystemUsage {
            timestamp: now_nanos(),
            fs_id: Some(FilesystemIdentifier { mountpoint }),
            used_bytes: Some(UInt64Value { value: self.lock().images.iter().map(|i| i.size).sum() }),
            ..Default::default()
        };
        Ok(Response::new(ImageFsInfoResponse { image_filesystems: vec![fs], ..Default::default() }))
    }
}

/// What containerd 2.x reports for a container it created from `config`: the process identity
/// (uid, gid, and the groups: the primary one first, then the supplemental ones; the fake's
/// images define no groups of their own) and the Linux resources it applied.
fn reported_identity_and_resources(config: &ContainerConfig) -> (Option<ContainerUser>, Option<ContainerResources>) {
    let linux = config.linux.as_ref();
    let security = linux.and_then(|l| l.security_context.as_ref());
    let uid = security.and_then(|s| s.run_as_user.as_ref()).map_or(0, |v| v.value);
    let gid = security.and_then(|s| s.run_as_group.as_ref()).map_or(0, |v| v.value);
    let mut groups = vec![gid];
    for g in security.map(|s| s.supplemental_groups.clone()).unwrap_or_default() {
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let user = ContainerUser { linux: Some(LinuxContainerUser { uid, gid, supplemental_groups: groups }) };
    let resources =
        linux.and_then(|l| l.resources.clone()).map(|r| ContainerResources { linux: Some(r), ..Default::default() });
    (Some(user), resources)
}
