//! One task per pod: observe, plan, act, report, wait. Pods never block each other, and a
//! pod that cannot run only ever affects itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::join_all;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

mod resize;

use super::Shared;
use super::prober::Probers;
use crate::events::EventType;
use crate::runtime::{Driver, StartError, Started};
use gantry_pod::backoff::{self, Backoff};
use gantry_pod::plan::{self, KillReason, PodActions, Start};
use gantry_pod::probe::{self, Health, ProbeKill};
use gantry_pod::shutdown;
use gantry_pod::start_failure::StartFailure;
use gantry_pod::status::{self, Waiting};
use gantry_pod::{ContainerInfo, ContainerState, Nanos, ObservedPod, SandboxInfo};
use gantry_vocab::spec;

pub enum Msg {
    /// A newer copy of the pod (same UID); it calls for a sync unless only the pod's own
    /// status came back ([`gantry_pod::status::needs_sync`]).
    Update(Arc<Pod>),
    /// Something about the pod may have changed in the runtime; look again.
    Wake,
    /// The relist saw the pod changed, in a list that ended at this instant: a worker that
    /// has looked at its pod since then has seen all of it.
    Relisted(tokio::time::Instant),
    /// The pod is no longer wanted: stop it gracefully and remove it.
    Terminate,
    /// The node shuts down or the pod is evicted: stop it within the kill's grace, leave it
    /// `Failed` for its reason, then signal its `done`. Boxed: every pod's channel holds
    /// blocks of 32 messages, each as large as the largest one.
    Stop(Box<super::Kill>),
}

/// Upper bound on how long a pod goes without being looked at.
/// While an init container runs, look more often than the relist does, so the next one
/// starts promptly.
const INIT_POLL: Duration = Duration::from_millis(200);
const MAX_ERROR_DELAY: Duration = Duration::from_secs(10);
/// Plan/act rounds per sync before yielding; a converging pod needs two or three.
const MAX_ROUNDS: usize = 6;

/// How a sandbox creation went.
enum Created {
    /// Ready, as the runtime showed it right after: its containers start now.
    Sandbox(SandboxInfo),
    /// Created, but not seen ready: the next round looks at the pod again.
    Unseen,
    /// Not created (the event says why).
    Failed,
}

pub struct Handle {
    pub tx: mpsc::UnboundedSender<Msg>,
    /// The pod as the worker last got it.
    pub pod: Arc<Pod>,
    pub terminating: bool,
}

/// Starts the worker; `done` receives the UID once the pod has been terminated and removed.
pub fn spawn(
    pod: Arc<Pod>,
    shared: Arc<Shared>,
    done: mpsc::UnboundedSender<String>,
    tasks: &mut JoinSet<()>,
) -> Handle {
    start(pod, shared, done, tasks, false)
}

/// A worker that only stops and removes a pod (one that no source defines any more).
pub fn spawn_terminator(
    pod: Arc<Pod>,
    shared: Arc<Shared>,
    done: mpsc::UnboundedSender<String>,
    tasks: &mut JoinSet<()>,
) -> Handle {
    start(pod, shared, done, tasks, true)
}

/// The worker runs in `tasks`, its owner's: it stops when the owner does.
fn start(
    pod: Arc<Pod>,
    shared: Arc<Shared>,
    done: mpsc::UnboundedSender<String>,
    tasks: &mut JoinSet<()>,
    terminating: bool,
) -> Handle {
    let (tx, rx) = mpsc::unbounded_channel();
    let uid = spec::uid(&pod).to_string();
    let probers = Probers::new(&tx);
    let handle = Handle { tx, pod: pod.clone(), terminating };
    let worker = Worker::new(pod, shared, probers);
    // Mapped rather than awaited in an `async` block, which would hold the worker twice over
    // (once captured, once inside the future it awaits) for the pod's whole life.
    let finished = move |()| {
        let _ = done.send(uid);
    };
    if terminating {
        drop(rx);
        tasks.spawn(Box::pin(worker.terminate()).map(finished));
    } else {
        tasks.spawn(worker.run(rx).map(finished));
    }
    handle
}

/// Messages that came while a sync ran (stops and terminations interrupt it instead).
#[derive(Default)]
struct Early {
    /// The latest copy of the pod.
    update: Option<Arc<Pod>>,
    /// Whether anything came that calls for another sync whatever the sync saw.
    any: bool,
    /// The latest relist that saw the pod changed.
    relisted: Option<tokio::time::Instant>,
}

struct Worker {
    /// The pod with its allocated resources: what the worker runs.
    pod: Arc<Pod>,
    /// The pod as its source defines it (its resources may wait for a resize).
    desired: Arc<Pod>,
    resize: resize::ResizeState,
    shared: Arc<Shared>,
    backoff: Backoff,
    /// Why containers are not running, from the last attempt to start them.
    waiting: HashMap<String, Waiting>,
    error_delay: Option<Duration>,
    /// Set when the last start attempt failed only because image pulls are backed off: how
    /// long until the first of them may be tried again.
    image_retry: Option<Duration>,
    start_time: Option<Nanos>,
    probers: Probers,
    /// When this worker first saw the pod; None once its start duration was recorded.
    seen_at: Option<std::time::Instant>,
    /// What admission saw of the pod in the runtime (and when it began to look), moments
    /// before the first sync: that sync starts from it rather than listing the pod again.
    admitted_as: Option<(tokio::time::Instant, ObservedPod)>,
    /// When the look behind the latest round began.
    looking_since: Option<tokio::time::Instant>,
    /// When the look whose result was last reported began: a relist that ended before then
    /// has nothing new for the worker.
    reported_look: Option<tokio::time::Instant>,
}

impl Worker {
    fn new(pod: Arc<Pod>, shared: Arc<Shared>, probers: Probers) -> Self {
        Worker {
            desired: pod.clone(),
            pod,
            resize: Default::default(),
            shared,
            backoff: Backoff::default(),
            waiting: HashMap::new(),
            error_delay: None,
            image_retry: None,
            start_time: None,
            probers,
            seen_at: Some(std::time::Instant::now()),
            admitted_as: None,
            looking_since: None,
            reported_look: None,
        }
    }

    /// The pod's task lives as long as the pod and mostly sleeps; the futures of its steps are
    /// boxed so that they take memory only while they run (inline, each idle task kept ~20 KiB).
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        if let Err((reason, message)) = Box::pin(self.admit()).await {
            self.admitted_as = None;
            return Box::pin(self.rejected(reason, &message, rx)).await;
        }
        self.shared.allocations.admit(&self.desired);
        self.pod = self.shared.allocations.apply(&self.desired);
        loop {
            let mut early = Early::default();
            let wait = match Box::pin(self.sync_unless_stopped(&mut rx, &mut early)).await {
                Ok(wait) => wait,
                Err(stop) => return Box::pin(self.end(stop, rx)).await,
            };
            if let Some(pod) = early.update {
                self.update(pod);
            }
            if early.any || early.relisted.is_some_and(|at| !self.looked_since(at)) {
                // What came during the sync is looked at now, as it would have been after it.
                continue;
            }
            let next = tokio::time::Instant::now() + wait;
            loop {
                tokio::select! {
                    msg = rx.recv() => match msg {
                        Some(Msg::Update(pod)) if !status::needs_sync(&self.desired, &pod) => {
                            self.update(pod);
                            continue;
                        }
                        Some(Msg::Update(pod)) => self.update(pod),
                        Some(Msg::Wake) => {}
                        // A relist that listed before the last look began: nothing new.
                        Some(Msg::Relisted(at)) if self.looked_since(at) => continue,
                        Some(Msg::Relisted(_)) => {}
                        Some(stop @ (Msg::Terminate | Msg::Stop(_))) => return Box::pin(self.end(stop, rx)).await,
                        // The agent is gone (shutting down, or the TLS bootstrap phase handing
                        // its pods over): the pod keeps running, and the next agent adopts it.
                        None => return,
                    },
                    _ = tokio::time::sleep_until(next) => {}
                }
                break;
            }
        }
    }

    /// Whether the last reported look at the pod began at or after `at`.
    fn looked_since(&self, at: tokio::time::Instant) -> bool {
        self.reported_look.is_some_and(|look| look >= at)
    }

    /// Takes the newer copy; the status store keeps it too, so the older one is freed.
    fn update(&mut self, pod: Arc<Pod>) {
        self.pod = self.shared.allocations.apply(&pod);
        self.desired = pod;
        self.shared.statuses.renew(&self.pod);
    }

    /// One sync, cut short by a stop or a termination (as upstream's pod workers cancel a
    /// pod's sync once it is terminating): the pod stops within its grace even while the
    /// runtime is slow to answer the sync's calls. Dropping a sync is safe: the stop observes
    /// the pod afresh, and stopping its sandbox leaves no container an interrupted call
    /// created able to start. Updates and wake-ups that come meanwhile go to `early`.
    async fn sync_unless_stopped(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Msg>,
        early: &mut Early,
    ) -> Result<Duration, Msg> {
        let (pod, desired) = (self.pod.clone(), self.desired.clone());
        let mut sync = Box::pin(self.sync());
        let mut open = true;
        loop {
            tokio::select! {
                wait = &mut sync => return Ok(wait),
                msg = rx.recv(), if open => match msg {
                    Some(stop @ (Msg::Terminate | Msg::Stop(_))) => {
                        tracing::debug!(pod = %spec::full_name(&pod), pod_uid = spec::uid(&pod), "pod sync interrupted to stop the pod");
                        return Err(stop);
                    }
                    Some(Msg::Update(pod)) => {
                        early.any |= status::needs_sync(early.update.as_ref().unwrap_or(&desired), &pod);
                        early.update = Some(pod);
                    }
                    Some(Msg::Wake) => early.any = true,
                    Some(Msg::Relisted(at)) => early.relisted = early.relisted.max(Some(at)),
                    // The sync ends as it would have; the caller sees the channel closed.
                    None => open = false,
                },
            }
        }
    }

    /// Terminates the pod, or stops it and leaves it failed, as `msg` (one of those) says.
    async fn end(self, msg: Msg, rx: mpsc::UnboundedReceiver<Msg>) {
        match msg {
            Msg::Stop(kill) => {
                let super::Kill { grace, why, done, .. } = *kill;
                self.stop_and_fail(grace, why, done, rx).await
            }
            _ => self.terminate().await,
        }
    }

    /// Upstream admits a pod once, when it arrives; a pod that already has a sandbox (an agent
    /// restart) was admitted before. Keeps what it saw of the pod for the first sync.
    async fn admit(&mut self) -> Result<(), (&'static str, String)> {
        if *self.shared.shutting_down.borrow() {
            return Err((shutdown::NOT_ADMITTED_REASON, shutdown::NOT_ADMITTED_MESSAGE.to_string()));
        }
        let since = tokio::time::Instant::now();
        self.admitted_as = self.shared.observer.pod(spec::uid(&self.pod)).await.ok().map(|o| (since, o));
        if self.admitted_as.as_ref().is_some_and(|(_, o)| !o.sandboxes.is_empty()) {
            return Ok(());
        }
        let pressure = *self.shared.pressure.borrow();
        if let Some(message) = gantry_pod::eviction::refuse_admission(pressure, &self.pod) {
            return Err((gantry_pod::eviction::REASON, message));
        }
        self.shared.driver.admit(&self.pod)?;
        self.shared.driver.admit_devices(&self.pod).await
    }

    /// A rejected pod never starts: it fails with the reason, and waits to be removed.
    async fn rejected(mut self, reason: &str, message: &str, mut rx: mpsc::UnboundedReceiver<Msg>) {
        self.shared.events.record(&self.pod, None, EventType::Warning, reason, message);
        let status = k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            reason: Some(reason.to_string()),
            message: Some(format!("Pod was rejected: {message}")),
            qos_class: Some(gantry_pod::qos::class(&self.pod).as_str().to_string()),
            // As every status the kubelet writes (PodObservedGenerationTracking).
            observed_generation: self.pod.metadata.generation,
            ..Default::default()
        };
        self.shared.statuses.set(&self.pod, status);
        loop {
            match rx.recv().await {
                Some(Msg::Update(pod)) => self.pod = pod,
                Some(Msg::Wake | Msg::Relisted(_) | Msg::Stop(_)) => {}
                Some(Msg::Terminate) => return self.terminate().await,
                None => return,
            }
        }
    }

    /// Brings the pod one step closer to its spec; returns how long to wait before the next
    /// look (absent any message).
    async fn sync(&mut self) -> Duration {
        self.allocate_resize();
        for _ in 0..MAX_ROUNDS {
            let observed = match self.observe().await {
                Ok(observed) => observed,
                Err(e) => {
                    tracing::warn!(pod = %spec::full_name(&self.pod), error = %e, "cannot read pod state from the runtime");
                    return self.failed();
                }
            };
            let now = now();
            self.probers.sync(&self.pod, &observed, &self.shared);
            let health = self.probers.health();
            let actions = plan::compute(&self.pod, &observed, &health, &self.backoff, now, self.shared.started_at);
            let probe_kills = probe::kills(&self.pod, &observed, &health);
            self.note_back_off(&actions);
            if actions.start.is_empty()
                && actions.kill_containers.is_empty()
                && actions.create_sandbox.is_none()
                && !actions.kill_pod
                && probe_kills.is_empty()
            {
                if let Some(sandbox) = observed.current_sandbox() {
                    self.shared.driver.refresh_volumes(&self.pod, sandbox.ip.as_deref()).await;
                }
                if self.actuate_resize(&observed).await {
                    continue;
                }
                self.publish(&observed, &health, now);
                self.error_delay = None;
                return self.next_wait(&observed, &actions);
            }
            if !self.kill_unhealthy(&probe_kills, &observed).await || !self.execute(&actions, &observed, now).await {
                if let Ok(observed) = self.observe().await {
                    self.publish(&observed, &self.probers.health(), now);
                }
                // Image pull backoff has its own schedule; looking earlier only repeats BackOff.
                return self.image_retry.take().unwrap_or_else(|| self.failed());
            }
        }
        // Still not converged: something undoes our actions (e.g. a container that never
        // leaves an unknown state); back off rather than spin.
        self.failed()
    }

    /// The pod in the runtime: what admission just saw of it, on the first sync; listed afresh
    /// after that.
    async fn observe(&mut self) -> Result<ObservedPod, gantry_cri::CriError> {
        let (since, observed) = match self.admitted_as.take() {
            Some((since, observed)) => (since, Ok(observed)),
            None => (tokio::time::Instant::now(), self.shared.observer.pod(spec::uid(&self.pod)).await),
        };
        self.looking_since = Some(since);
        observed
    }

    fn next_wait(&self, observed: &ObservedPod, actions: &PodActions) -> Duration {
        // Sidecars keep running; their startup is reported by their prober, which wakes us.
        let init_running = spec::init_containers(&self.pod)
            .iter()
            .filter(|c| !spec::is_sidecar(c))
            .any(|c| observed.latest(&c.name).is_some_and(|i| i.state == ContainerState::Running));
        let mut wait = if init_running { INIT_POLL } else { self.shared.sync_frequency };
        if let Some(backoff) = actions.next_wake() {
            wait = wait.min(Duration::from_nanos(backoff as u64));
        }
        wait
    }

    fn failed(&mut self) -> Duration {
        let delay = self.error_delay.map_or(Duration::from_secs(1), |d| (d * 2).min(MAX_ERROR_DELAY));
        self.error_delay = Some(delay);
        delay
    }

    fn note_back_off(&mut self, actions: &PodActions) {
        for b in &actions.back_off {
            let waiting = Waiting { reason: "CrashLoopBackOff".into(), message: b.delay_message.clone() };
            if self.waiting.get(&b.name) != Some(&waiting) {
                self.shared.events.record(
                    &self.pod,
                    Some(&b.name),
                    EventType::Warning,
                    "BackOff",
                    &format!("Back-off restarting failed container {} in pod {}", b.name, spec::format_pod(&self.pod)),
                );
            }
            self.waiting.insert(b.name.clone(), waiting);
        }
    }

    /// Kills containers whose liveness or startup probe failed; the plan restarts them per the
    /// restart policy once they exited. Returns false if a kill failed.
    async fn kill_unhealthy(&self, kills: &[ProbeKill], observed: &ObservedPod) -> bool {
        let pod_ip = observed.current_sandbox().and_then(|s| s.ip.as_deref());
        for k in kills {
            let Some(info) = observed.containers.iter().find(|c| c.id == k.id) else { continue };
            self.shared.events.record(&self.pod, Some(&k.name), EventType::Normal, "Killing", &k.message);
            let grace = spec::any_container(&self.pod, &k.name)
                .and_then(|c| k.kind.of(&c)?.termination_grace_period_seconds)
                .map_or_else(|| Driver::grace(&self.pod), |s| Duration::from_secs(s.max(0) as u64));
            if !self.stop_container(info, grace, pod_ip).await {
                return false;
            }
        }
        true
    }

    /// Stops one container (preStop first); returns false if StopContainer failed.
    async fn stop_container(&self, info: &ContainerInfo, grace: Duration, pod_ip: Option<&str>) -> bool {
        let (result, hook_failed) =
            self.shared.driver.stop_container(&self.pod, &info.name, &info.id, grace, pod_ip).await;
        if hook_failed {
            self.failed_pre_stop(&info.name);
        }
        if let Err(e) = result {
            tracing::warn!(pod = %spec::full_name(&self.pod), container = %info.name, error = %e, "cannot stop container");
            return false;
        }
        true
    }

    /// A container created but never started has no process to stop, no preStop hook to run
    /// and no logs to keep: it is removed so that it does not linger beside its replacement.
    async fn remove_never_started(&self, k: &plan::Kill) -> bool {
        if let Err(e) = self.shared.driver.remove_container(&k.id).await {
            tracing::warn!(pod = %spec::full_name(&self.pod), container = %k.name, error = %e, "cannot remove container that never started");
            return false;
        }
        tracing::info!(pod = %spec::full_name(&self.pod), container = %k.name, "removed container that was created but never started");
        true
    }

    fn failed_pre_stop(&self, name: &str) {
        self.shared.events.record(&self.pod, Some(name), EventType::Warning, "FailedPreStopHook", "PreStopHook failed");
    }

    /// Returns false if any step failed (the failure is recorded for the status).
    async fn execute(&mut self, actions: &PodActions, observed: &ObservedPod, now: Nanos) -> bool {
        let driver = &self.shared.driver;
        let grace = Driver::grace(&self.pod);
        if actions.kill_pod {
            self.killing_events(observed.running().map(|c| c.name.as_str()));
            match driver.kill_pod(&self.pod, observed, grace).await {
                Ok(failed_hooks) => failed_hooks.iter().for_each(|name| self.failed_pre_stop(name)),
                Err(e) => {
                    tracing::warn!(pod = %spec::full_name(&self.pod), error = %e, "cannot stop pod");
                    return false;
                }
            }
        }
        for k in &actions.kill_containers {
            if k.reason == KillReason::NeverStarted {
                if !self.remove_never_started(k).await {
                    return false;
                }
                continue;
            }
            let why = match k.reason {
                KillReason::SpecChanged if spec::sidecars(&self.pod).any(|c| c.name == k.name) => {
                    format!("Init container {} definition changed", k.name)
                }
                KillReason::SpecChanged => format!("Container {} definition changed, will be restarted", k.name),
                KillReason::Stuck | KillReason::NeverStarted => format!("Stopping container {}", k.name),
            };
            self.shared.events.record(&self.pod, Some(&k.name), EventType::Normal, "Killing", &why);
            let Some(info) = observed.containers.iter().find(|c| c.id == k.id) else { continue };
            let pod_ip = observed.current_sandbox().and_then(|s| s.ip.as_deref());
            if !self.stop_container(info, grace, pod_ip).await {
                return false;
            }
        }
        let created;
        let sandbox = match actions.create_sandbox {
            // As upstream, the containers start in the same sync as their sandbox.
            Some(attempt) => match self.create_sandbox(attempt).await {
                Created::Sandbox(sandbox) => {
                    created = sandbox;
                    &created
                }
                Created::Unseen => return true,
                Created::Failed => return false,
            },
            None => match observed.current_sandbox() {
                Some(sandbox) => sandbox,
                None => return false,
            },
        };
        self.start_all(&actions.start, sandbox, now).await
    }

    async fn create_sandbox(&mut self, attempt: u32) -> Created {
        if attempt > 0 {
            self.shared.events.record(
                &self.pod,
                None,
                EventType::Normal,
                "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.",
            );
        }
        let id = match self.shared.driver.create_sandbox(&self.pod, attempt).await {
            Ok(id) => id,
            Err(e) => {
                self.shared.events.record(&self.pod, None, EventType::Warning, "FailedCreatePodSandBox", &e.message);
                return Created::Failed;
            }
        };
        self.start_time.get_or_insert_with(now);
        match self.shared.observer.created_sandbox(&id).await {
            Ok(Some(sandbox)) if sandbox.ready => Created::Sandbox(sandbox),
            Ok(_) => Created::Unseen,
            Err(e) => {
                tracing::debug!(pod = %spec::full_name(&self.pod), error = %e, "cannot read the new sandbox's status");
                Created::Unseen
            }
        }
    }

    async fn start_all(&mut self, starts: &[Start], sandbox: &SandboxInfo, now: Nanos) -> bool {
        let uid = spec::uid(&self.pod).to_string();
        for s in starts.iter().filter_map(|s| s.restart_of.map(|f| (s, f))) {
            self.backoff.record_restart(&backoff::key(&uid, &s.0.name), s.1, now);
        }
        let driver = &self.shared.driver;
        let pod = &self.pod;
        let results = join_all(starts.iter().map(|s| async move {
            let c = spec::any_container(pod, &s.name)?;
            let target = s.target_id.as_deref();
            let result = driver.start_container(pod, &c, &sandbox.id, s.attempt, sandbox.ip.as_deref(), target).await;
            Some((s, c.image.clone().unwrap_or_default(), result))
        }))
        .await;
        let mut ok = true;
        let mut image_retry = None::<Duration>;
        let mut other_failure = false;
        for (s, image, result) in results.into_iter().flatten() {
            if result.as_ref().is_err_and(|e| e.reason == StartFailure::ImagePullBackOff) {
                let remaining = self.shared.driver.images().backoff_remaining(&self.pod, &image).unwrap_or_default();
                image_retry = Some(image_retry.map_or(remaining, |r| r.min(remaining)));
            } else {
                other_failure |= result.is_err();
            }
            ok &= self.record_start(s, result);
        }
        self.image_retry = image_retry.filter(|_| !other_failure);
        ok
    }

    fn record_start(&mut self, s: &Start, result: Result<Started, StartError>) -> bool {
        let event = |reason: &str, message: &str| {
            self.shared.events.record(&self.pod, Some(&s.name), EventType::Normal, reason, message)
        };
        // Upstream records each step the runtime took: Created once CreateContainer returned,
        // Started once StartContainer did (before the postStart hook), whatever failed later.
        let (created, started) = match &result {
            Ok(_) => (true, true),
            Err(e) => (
                matches!(e.reason, StartFailure::RunContainerError | StartFailure::PostStartHookError),
                e.reason == StartFailure::PostStartHookError,
            ),
        };
        if created {
            event("Created", &format!("Created container: {}", s.name));
        }
        if started {
            event("Started", &format!("Started container {}", s.name));
        }
        match result {
            Ok(started) => {
                tracing::debug!(container_id = %started.id, container = %s.name, "container started");
                self.waiting.remove(&s.name);
                true
            }
            Err(e) if e.reason == StartFailure::PostStartHookError => {
                // The details (which may hold secrets) go only into the status, as upstream.
                let event = |kind, reason: &str, message: &str| {
                    self.shared.events.record(&self.pod, Some(&s.name), kind, reason, message)
                };
                event(EventType::Warning, "FailedPostStartHook", "PostStartHook failed");
                event(EventType::Normal, "Killing", "FailedPostStartHook");
                self.waiting
                    .insert(s.name.clone(), Waiting { reason: e.reason.reason().to_string(), message: e.message });
                false
            }
            Err(e) if e.reason == StartFailure::ContainerCreating => {
                self.shared.events.record(&self.pod, None, EventType::Warning, "FailedMount", &e.message);
                self.waiting
                    .insert(s.name.clone(), Waiting { reason: e.reason.reason().to_string(), message: e.message });
                false
            }
            Err(e) => {
                // The image puller already reported the details of image failures.
                let message = match e.reason {
                    r if r.is_image() => format!("Error: {}", r.reason()),
                    _ => format!("Error: {}", e.message),
                };
                self.shared.events.record(&self.pod, Some(&s.name), EventType::Warning, "Failed", &message);
                self.waiting
                    .insert(s.name.clone(), Waiting { reason: e.reason.reason().to_string(), message: e.message });
                false
            }
        }
    }

    fn killing_events<'a>(&self, names: impl Iterator<Item = &'a str>) {
        for name in names {
            self.shared.events.record(
                &self.pod,
                Some(name),
                EventType::Normal,
                "Killing",
                &format!("Stopping container {name}"),
            );
        }
    }

    fn publish(&mut self, observed: &ObservedPod, health: &HashMap<String, Health>, now: Nanos) {
        self.shared.seen.note(spec::uid(&self.pod), observed);
        self.reported_look = self.looking_since;
        let status = self.current_status(observed, health, now);
        self.report(status);
    }

    /// The pod's status as `observed`.
    fn current_status(&mut self, observed: &ObservedPod, health: &HashMap<String, Health>, now: Nanos) -> PodStatus {
        // A container that runs again no longer waits for anything.
        self.waiting.retain(|name, _| !observed.latest(name).is_some_and(|i| i.state == ContainerState::Running));
        if self.start_time.is_none() && observed.current_sandbox().is_some() {
            self.start_time = observed.current_sandbox().map(|s| s.created_at);
        }
        let previous = self.previous_status();
        let status = status::compute(&status::Input {
            pod: &self.pod,
            observed,
            waiting: &self.waiting,
            health,
            runtime_name: self.shared.driver.runtime_name(),
            recursive_read_only: self.shared.driver.supports_recursive_read_only(),
            host_ip: self.shared.host_ip.as_deref(),
            start_time: self.start_time,
            previous: previous.as_deref(),
            now,
        });
        self.resize.add_conditions(status)
    }

    /// The status last reported; before our first report, the API's view (if any).
    fn previous_status(&self) -> Option<Arc<PodStatus>> {
        let reported = self.shared.statuses.status(spec::uid(&self.pod));
        reported.or_else(|| self.pod.status.clone().map(Arc::new))
    }

    fn report(&mut self, status: PodStatus) {
        let old_phase = self.previous_status().and_then(|s| s.phase.clone());
        if old_phase != status.phase {
            tracing::info!(pod = %spec::full_name(&self.pod), pod_uid = spec::uid(&self.pod), phase = status.phase.as_deref().unwrap_or_default(), "pod phase changed");
        }
        if status.phase.as_deref() == Some("Running")
            && let Some(seen) = self.seen_at.take()
        {
            self.shared.metrics.pod_start_duration.observe(seen.elapsed().as_secs_f64());
        }
        // A finished pod is no longer active: its devices are free for others (upstream's
        // device manager counts only active pods).
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            self.shared.driver.release_devices(spec::uid(&self.pod));
        }
        self.shared.statuses.set(&self.desired, status);
    }

    /// Graceful node shutdown or an eviction: stops the pod's containers (preStop hooks
    /// included) within `grace` (at least upstream's 2 s minimum), reports it `Failed` for
    /// `why`, signals `done`, and then keeps it stopped: nothing restarts it, and only a
    /// terminate removes it.
    async fn stop_and_fail(
        mut self,
        grace: Duration,
        why: super::KillReason,
        done: oneshot::Sender<()>,
        mut rx: mpsc::UnboundedReceiver<Msg>,
    ) {
        let grace = grace.max(Duration::from_secs(spec::MIN_GRACE_SECONDS as u64));
        let uid = spec::uid(&self.pod).to_string();
        let name = spec::full_name(&self.pod);
        tracing::info!(pod = %name, pod_uid = %uid, grace_seconds = grace.as_secs(), reason = ?why, "stopping pod");
        match self.shared.observer.pod(&uid).await {
            Ok(observed) => {
                self.killing_events(observed.running().map(|c| c.name.as_str()));
                match self.shared.driver.kill_pod(&self.pod, &observed, grace).await {
                    Ok(failed_hooks) => failed_hooks.iter().for_each(|name| self.failed_pre_stop(name)),
                    Err(e) => tracing::warn!(pod = %name, error = %e, "cannot stop pod"),
                }
            }
            Err(e) => tracing::warn!(pod = %name, error = %e, "cannot read pod state from the runtime"),
        }
        let observed = self.shared.observer.pod(&uid).await.unwrap_or_default();
        self.probers.sync(&self.pod, &observed, &self.shared);
        let status = self.current_status(&observed, &self.probers.health(), now());
        let now = gantry_pod::status::time(now());
        let generation = self.pod.metadata.generation;
        self.report(match &why {
            super::KillReason::Shutdown => shutdown::stopped_status(status, generation, now),
            super::KillReason::Evicted { message, disruption_target } => {
                gantry_pod::eviction::evicted_status(status, generation, message, *disruption_target, now)
            }
        });
        let _ = done.send(());
        loop {
            match rx.recv().await {
                Some(Msg::Update(pod)) => self.desired = pod,
                Some(Msg::Wake | Msg::Relisted(_) | Msg::Stop(_)) => {}
                Some(Msg::Terminate) => return self.terminate().await,
                None => return,
            }
        }
    }

    /// Stops the pod within what is left of its grace period (all of it unless the API set a
    /// deadline, which an agent restarted mid-termination must keep), then removes its
    /// containers, sandboxes and files.
    async fn terminate(self) {
        let uid = spec::uid(&self.pod).to_string();
        let grace = Duration::from_secs(spec::remaining_grace_seconds(&self.pod, now()) as u64);
        let mut delay = Duration::from_secs(1);
        loop {
            match self.try_terminate(grace).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(pod = %spec::full_name(&self.pod), error = %e, "cannot stop pod; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_ERROR_DELAY);
                }
            }
        }
        self.shared.statuses.remove(&uid);
        self.shared.driver.release_devices(&uid);
        tracing::info!(pod = %spec::full_name(&self.pod), pod_uid = %uid, "pod stopped and removed");
        if let Some(api) = &self.shared.api
            && gantry_vocab::keys::is_api_pod(&self.pod)
        {
            api.delete_pod(&self.pod).await;
        }
    }

    async fn try_terminate(&self, grace: Duration) -> Result<(), gantry_cri::CriError> {
        let uid = spec::uid(&self.pod);
        let observed = self.shared.observer.pod(uid).await?;
        self.killing_events(observed.running().map(|c| c.name.as_str()));
        for name in self.shared.driver.kill_pod(&self.pod, &observed, grace).await? {
            self.failed_pre_stop(&name);
        }
        let observed = self.shared.observer.pod(uid).await?;
        self.shared.driver.remove_pod(uid, &observed).await?;
        let log_dir = gantry_vocab::paths::pod_log_dir(&self.shared.pod_logs_dir, &self.pod);
        if let Err(e) = tokio::fs::remove_dir_all(&log_dir).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %log_dir.display(), error = %e, "cannot remove pod log directory");
        }
        Ok(())
    }
}

pub fn now() -> Nanos {
    crate::clock::now()
}
