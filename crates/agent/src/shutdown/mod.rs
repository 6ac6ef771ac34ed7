//! Graceful node shutdown (upstream's node shutdown manager): holds a logind `delay` inhibitor
//! lock, and when logind announces a shutdown (`PrepareForShutdown(true)`) makes the Node not
//! ready, stops the pods group by group as [`gantry_pod::shutdown`] plans it (through their
//! workers, so preStop hooks and grace periods apply), leaves them `Failed`, and releases the
//! lock so that the shutdown goes on. A cancelled shutdown (`PrepareForShutdown(false)`) takes
//! the lock again; stopped pods stay stopped, as upstream.

pub mod logind;
mod state;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use crate::agent::{Kill, KillReason, Shared};
use crate::events::{EventType, NodeEvent};
use gantry_config::{Gate, Settings};
use gantry_pod::shutdown::{self, Group, Stage};
use logind::{InhibitLock, Logind};

/// Upstream waits this long before watching again after the bus connection ended.
const RECONNECT: Duration = Duration::from_secs(1);
/// A watch that keeps failing (no logind) is retried with backoff up to this.
const MAX_RETRY: Duration = Duration::from_secs(300);
/// How often, and how many times, logind's delay is read back after the reload (upstream's
/// newer trees: 100 ms doubling, 5 steps).
const RELOAD_POLL: Duration = Duration::from_millis(100);
const RELOAD_ATTEMPTS: u32 = 5;

/// Why the manager cannot watch for shutdowns.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    #[error("cannot use logind over D-Bus: {0}")]
    Bus(#[from] zbus::Error),
    #[error(
        "unable to override inhibit delay by shutdown manager: failed writing logind shutdown inhibit override file in {dir}: {source}"
    )]
    DropIn { dir: String, source: std::io::Error },
    #[error(
        "node shutdown manager was timed out after {RELOAD_ATTEMPTS} attempts waiting for logind InhibitDelayMaxSec to \
         update to {requested:?} (ShutdownGracePeriod), current value is {current:?}"
    )]
    InhibitDelay { requested: Duration, current: Duration },
}

/// The running manager.
pub struct ShutdownManager {
    groups: Vec<Group>,
    /// `<root-dir>/graceful_node_shutdown_state`, kept (with the two shutdown time metrics)
    /// when `GracefulNodeShutdownBasedOnPodPriority` is on, as upstream.
    state_file: Option<PathBuf>,
    shared: Arc<Shared>,
    kills: mpsc::UnboundedSender<Kill>,
}

impl ShutdownManager {
    /// The manager for `settings`, or `None` (logged as upstream) when graceful shutdown is off.
    pub fn new(
        settings: &Settings,
        shared: Arc<Shared>,
        kills: mpsc::UnboundedSender<Kill>,
    ) -> Option<ShutdownManager> {
        if !settings.feature_gates.enabled(Gate::GracefulNodeShutdown) {
            tracing::info!("Node graceful shutdown feature is disabled, node shutdown will be immediate");
            return None;
        }
        let s = &settings.shutdown;
        let by_priority: Vec<Group> = if settings.feature_gates.enabled(Gate::GracefulNodeShutdownBasedOnPodPriority) {
            s.grace_period_by_pod_priority.iter().map(|p| Group { priority: p.priority, seconds: p.seconds }).collect()
        } else {
            Vec::new()
        };
        let groups = shutdown::groups(s.grace_period, s.grace_period_critical_pods, &by_priority);
        if groups.is_empty() {
            tracing::info!("No graceful configuration specified, node shutdown will be immediate");
            return None;
        }
        tracing::info!(
            shutdown_grace_period = ?s.grace_period,
            shutdown_grace_period_critical_pods = ?s.grace_period_critical_pods,
            shutdown_grace_period_by_pod_priority = ?groups,
            "Creating node shutdown manager"
        );
        let state_file = settings
            .feature_gates
            .enabled(Gate::GracefulNodeShutdownBasedOnPodPriority)
            .then(|| settings.root_dir.join(state::FILE));
        Some(ShutdownManager { groups, state_file, shared, kills })
    }

    /// Watches for shutdowns for the node's lifetime. Without logind (no system bus, no
    /// logind, no permission) graceful shutdown is off: logged once, retried with backoff.
    pub async fn run(self) {
        if let Some(file) = &self.state_file {
            // The last shutdown's times, from before this start.
            let last = state::load(file);
            self.set_metrics(&last);
        }
        let mut retry = RECONNECT;
        let mut last_error = None::<String>;
        loop {
            match self.watch().await {
                Ok(()) => {
                    tracing::info!("the D-Bus connection to logind ended; watching for node shutdown events again");
                    retry = RECONNECT;
                    last_error = None;
                }
                Err(e) => {
                    let message = e.to_string();
                    if last_error.as_ref() != Some(&message) {
                        tracing::warn!(error = %message, retry_in = ?retry, "graceful node shutdown is not active: unable to watch the node for shutdown events");
                    }
                    last_error = Some(message);
                }
            }
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(MAX_RETRY);
        }
    }

    /// One connection to logind: the delay, the lock, then every signal until the bus ends.
    async fn watch(&self) -> Result<(), ShutdownError> {
        let logind = Logind::connect().await?;
        self.ensure_inhibit_delay(&logind, Path::new(logind::DROP_IN_DIR)).await?;
        let mut signals = logind.shutdown_signals().await?;
        let mut lock = Some(logind.inhibit_shutdown().await?);
        tracing::info!(
            requested = ?shutdown::requested(&self.groups),
            "watching the node for shutdown events (logind delay inhibitor lock held)"
        );
        while let Some(signal) = signals.next().await {
            let start = signal.args()?.start;
            tracing::info!(
                event = if start { "shutdown" } else { "cancelled" },
                "Shutdown manager detected new shutdown event"
            );
            let message = if start { shutdown::EVENT_SHUTDOWN } else { shutdown::EVENT_CANCELLED };
            self.shared.events.record_node(&NodeEvent {
                type_: EventType::Normal,
                reason: shutdown::EVENT_REASON.into(),
                message: message.into(),
            });
            self.shared.shutting_down.send_replace(start);
            if start {
                let mut times = state::State { start: Some(jiff::Timestamp::now()), end: None };
                self.record(&times);
                self.stop_pods().await;
                times.end = Some(jiff::Timestamp::now());
                self.record(&times);
                release(&mut lock);
            } else {
                lock = Some(logind.inhibit_shutdown().await?);
            }
        }
        Ok(())
    }

    /// Raises logind's `InhibitDelayMaxSec` to the whole shutdown's length when it is shorter:
    /// the drop-in, a reload, and the new value read back.
    async fn ensure_inhibit_delay(&self, logind: &Logind, dir: &Path) -> Result<(), ShutdownError> {
        let requested = shutdown::requested(&self.groups);
        let current = logind.inhibit_delay().await?;
        if requested <= current {
            return Ok(());
        }
        let written = logind::write_drop_in(dir, requested)
            .map_err(|source| ShutdownError::DropIn { dir: dir.display().to_string(), source })?;
        logind.reload().await?;
        let mut wait = RELOAD_POLL;
        let mut updated = current;
        for _ in 0..RELOAD_ATTEMPTS {
            tokio::time::sleep(wait).await;
            updated = logind.inhibit_delay().await?;
            if updated >= requested {
                tracing::info!(
                    file = %written.display(), from = ?current, to = ?updated,
                    "raised logind's InhibitDelayMaxSec for graceful node shutdown and reloaded logind"
                );
                return Ok(());
            }
            wait *= 2;
        }
        Err(ShutdownError::InhibitDelay { requested, current: updated })
    }

    /// Stops the active pods stage by stage, each stage at most its window. Then, unlike
    /// upstream (which releases the lock at once), it waits for the pods still stopping and for
    /// the API server to have their final statuses, but only while the whole grace period lasts:
    /// logind goes on after it anyway, and the machine powers off with the statuses unsent.
    async fn stop_pods(&self) {
        tracing::info!("Shutdown manager processing shutdown event");
        let deadline = tokio::time::Instant::now() + shutdown::requested(&self.groups);
        let pods: Vec<k8s_openapi::api::core::v1::Pod> =
            self.shared.statuses.all().iter().map(|r| r.to_pod()).collect();
        let stages = shutdown::plan(&self.groups, &pods);
        let mut stopping = Vec::new();
        for stage in &stages {
            stopping.extend(self.stop_stage(stage).await);
        }
        let settled = async {
            futures::future::join_all(stopping).await;
            if self.shared.api.is_some() {
                self.shared.statuses.reported(self.shared.statuses.version()).await;
            }
        };
        if tokio::time::timeout_at(deadline, settled).await.is_err() {
            tracing::warn!("the grace period ended before every pod stopped and its final status was reported");
        }
        tracing::info!("Shutdown manager completed processing shutdown event, node will shutdown shortly");
    }

    /// Stops one stage's pods together; returns those still stopping when its window ended.
    async fn stop_stage(&self, stage: &Stage) -> Vec<oneshot::Receiver<()>> {
        let mut stopping = Vec::with_capacity(stage.kills.len());
        for kill in &stage.kills {
            tracing::info!(pod = %kill.name, pod_uid = %kill.uid, grace_period = kill.grace_seconds, "Shutdown manager killing pod with gracePeriod");
            let (done, rx) = oneshot::channel();
            let grace = Duration::from_secs(kill.grace_seconds.max(0) as u64);
            let _ = self.kills.send(Kill { uid: kill.uid.clone(), grace, why: KillReason::Shutdown, done });
            stopping.push(rx);
        }
        let (grace_period, priority) = (stage.window.as_secs(), stage.priority);
        let window = tokio::time::sleep(stage.window);
        tokio::pin!(window);
        let mut pending = stopping;
        while !pending.is_empty() {
            tokio::select! {
                (_, i, rest) = futures::future::select_all(pending.iter_mut()) => {
                    drop(rest);
                    pending.remove(i);
                }
                () = &mut window => {
                    tracing::info!(grace_period, priority, "Shutdown manager pod killing time out");
                    return pending;
                }
            }
        }
        tracing::info!(grace_period, priority, "Done waiting for all pods in group to terminate");
        Vec::new()
    }
}

impl ShutdownManager {
    /// Saves the shutdown's times and shows them in the metrics (an unfinished one's end is 0).
    fn record(&self, times: &state::State) {
        let Some(file) = &self.state_file else { return };
        if let Err(e) = state::store(file, times) {
            tracing::error!(file = %file.display(), error = %e, "Failed to store graceful shutdown state");
        }
        self.set_metrics(times);
    }

    fn set_metrics(&self, times: &state::State) {
        let seconds = |t: Option<jiff::Timestamp>| t.map_or(0.0, |t| t.as_nanosecond() as f64 / 1e9);
        self.shared.metrics.graceful_shutdown_start_time.set(seconds(times.start));
        self.shared.metrics.graceful_shutdown_end_time.set(seconds(times.end));
    }
}

/// Releasing the lock lets the shutdown go on.
fn release(lock: &mut Option<InhibitLock>) {
    if lock.take().is_some() {
        tracing::info!("released the shutdown inhibitor lock");
    }
}
