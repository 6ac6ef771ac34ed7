//! Node-pressure eviction (upstream's eviction manager), the I/O side: every 10 s (the
//! agent's clock) it reads the node's signals, runs [`gantry_pod::eviction`] over them, publishes
//! the pressure conditions (`Shared::pressure`, which the Node status and pod admission read),
//! evicts pods over their local storage limits, and under pressure reclaims node resources
//! (dead containers and unused images, for disk) before it evicts at most one pod, through the pod's worker like
//! any stop, and waits for it to be gone.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::{mpsc, oneshot};

use crate::agent::{ContainerReclaimer, Kill, KillReason, Shared};
use crate::events::{EventType, NodeEvent};
use crate::image::collector::ImageReclaimer;
use gantry_config::Settings;
use gantry_metrics::EvictionLabels;
use gantry_pod::eviction::{self as core, Eviction, Observations, Usage};
use gantry_vocab::spec;

/// How long upstream waits for an evicted pod to be cleaned up before it looks again.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// What every pass observes of the node: upstream reads it from the stats summary.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub observations: Observations,
    /// The runtime's images are on another file system than the root dir (upstream's
    /// `HasDedicatedImageFs`): then nodefs and imagefs usage are counted apart.
    pub dedicated_imagefs: bool,
}

/// Where the stats come from (the node API's summary in `gantry-node`; a test's own numbers).
/// The pods' usage (the runtime's container stats, and a walk of every volume and log) costs
/// far more than the node's signals, so a pass reads it only for the pods it must judge.
pub trait StatsSource: Send + Sync + 'static {
    /// The node's signals, read every pass.
    fn node(&self) -> impl Future<Output = Result<Stats, gantry_cri::CriError>> + Send;
    /// The usage of `pods` (by UID): for the ranking under pressure, and for the pods whose
    /// local storage has limits.
    fn usage(&self, pods: &[Pod]) -> impl Future<Output = Result<Usage, gantry_cri::CriError>> + Send;
}

/// What frees node-level disk before pods are evicted for it.
pub struct Reclaim {
    pub containers: ContainerReclaimer,
    pub images: ImageReclaimer,
}

pub struct EvictionManager<S> {
    shared: Arc<Shared>,
    stats: S,
    /// Frees disk (dead containers, then unused images) before any pod is evicted for it.
    reclaim: Reclaim,
    config: core::Config,
    kills: mpsc::UnboundedSender<Kill>,
    state: core::Manager,
    node: String,
    /// Whether the last stats read failed (a repeated failure is logged once).
    stats_failing: bool,
}

impl<S: StatsSource> EvictionManager<S> {
    /// The manager for the node's thresholds (validated by the configuration already).
    pub fn new(
        settings: &Settings,
        shared: Arc<Shared>,
        stats: S,
        reclaim: Reclaim,
        kills: mpsc::UnboundedSender<Kill>,
    ) -> Result<Self, core::ThresholdError> {
        let e = &settings.eviction;
        let thresholds = core::thresholds(
            &settings.eviction_hard,
            &e.soft,
            &e.soft_grace_period,
            &e.minimum_reclaim,
            gantry_config::parse_eviction_grace,
        )?;
        let config = core::Config {
            thresholds,
            max_pod_grace_seconds: e.max_pod_grace_period,
            transition_period: e.pressure_transition_period,
            local_storage_isolation: e.local_storage_capacity_isolation,
        };
        Ok(EvictionManager {
            shared,
            stats,
            reclaim,
            config,
            kills,
            state: core::Manager::default(),
            node: settings.node_name.clone(),
            stats_failing: false,
        })
    }

    /// Runs for the node's lifetime.
    pub async fn run(mut self) {
        if self.config.thresholds.is_empty() && !self.config.local_storage_isolation {
            return std::future::pending().await;
        }
        let mut tick = tokio::time::interval(core::MONITORING_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let evicted = self.synchronize().await;
            if !evicted.is_empty() {
                // As upstream, the next pass waits until the evicted pods are gone, so that it
                // sees what their eviction freed; at most one pod goes per interval.
                let all = futures::future::join_all(evicted);
                if tokio::time::timeout(CLEANUP_TIMEOUT, all).await.is_err() {
                    tracing::info!(node = %self.node, "Eviction manager: timed out waiting for pods to be cleaned up");
                }
            }
        }
    }

    async fn read_stats(&mut self) -> Option<Stats> {
        let stats = self.stats.node().await;
        self.checked(stats)
    }

    async fn read_usage(&mut self, pods: &[Pod]) -> Option<Usage> {
        let usage = self.stats.usage(pods).await;
        self.checked(usage)
    }

    /// A read's value; a failure is logged once until a read succeeds again.
    fn checked<T>(&mut self, read: Result<T, gantry_cri::CriError>) -> Option<T> {
        match read {
            Ok(value) => {
                self.stats_failing = false;
                Some(value)
            }
            Err(e) => {
                if !self.stats_failing {
                    tracing::warn!(node = %self.node, error = %e, "Eviction manager: failed to get summary stats");
                }
                self.stats_failing = true;
                None
            }
        }
    }

    /// One pass (upstream's `synchronize`); returns what to wait for: the evicted pods' stops.
    async fn synchronize(&mut self) -> Vec<oneshot::Receiver<()>> {
        let Some(stats) = self.read_stats().await else { return Vec::new() };
        let now = Timestamp::from_nanosecond(i128::from(crate::clock::now())).unwrap_or_else(|_| Timestamp::now());
        let pass = self.state.synchronize(&self.config, &stats.observations, now);
        self.shared.pressure.send_if_modified(|p| std::mem::replace(p, pass.pressure) != pass.pressure);
        let pods = active_pods(&self.shared);
        let refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
        if self.config.local_storage_isolation {
            // Only a pod with a limit can be over it: the others' usage is not read.
            let limited: Vec<Pod> =
                refs.iter().filter(|p| core::has_local_storage_limit(p)).map(|p| (*p).clone()).collect();
            if !limited.is_empty()
                && let Some(usage) = self.read_usage(&limited).await
            {
                let limited: Vec<&Pod> = limited.iter().collect();
                let over = core::local_storage(&limited, &usage, stats.dedicated_imagefs);
                if !over.is_empty() {
                    return over.iter().filter_map(|e| self.evict(&pods, e)).collect();
                }
            }
        }
        let Some(threshold) = &pass.reclaim else { return Vec::new() };
        let resource = threshold.signal.resource();
        tracing::info!(node = %self.node, resource = %resource, "Eviction manager: attempting to reclaim");
        self.shared.events.record_node(&NodeEvent {
            type_: EventType::Warning,
            reason: core::THRESHOLD_MET_EVENT.into(),
            message: format!("Attempting to reclaim {resource}"),
        });
        if core::reclaims_images_and_containers(threshold.signal) {
            // Dead containers first: the images they hold become unused.
            self.reclaim.containers.delete_dead().await;
            self.reclaim.images.delete_unused().await;
            if let Some(after) = self.read_stats().await
                && core::reclaimed_enough(&self.config, &after.observations)
            {
                tracing::info!(node = %self.node, resource = %resource, "Eviction manager: able to reduce resource pressure without evicting pods.");
                return Vec::new();
            }
        }
        if refs.is_empty() {
            tracing::error!(node = %self.node, "Eviction manager: eviction thresholds have been met, but no pods are active to evict");
            return Vec::new();
        }
        // Copied only under pressure: the stats read takes owned pods.
        let owned: Vec<Pod> = refs.iter().map(|p| (*p).clone()).collect();
        let Some(usage) = self.read_usage(&owned).await else { return Vec::new() };
        let chosen = core::choose(&self.config, &pass, &refs, &usage, &stats.observations, stats.dedicated_imagefs);
        match chosen {
            Some(e) => self.evict(&pods, &e).into_iter().collect(),
            None => {
                tracing::info!(node = %self.node, "Eviction manager: unable to evict any pods from the node");
                Vec::new()
            }
        }
    }

    /// Records the `Evicted` event and hands the pod to its worker to stop.
    fn evict(&self, pods: &[Arc<Pod>], e: &Eviction) -> Option<oneshot::Receiver<()>> {
        let pod = pods.iter().find(|p| spec::uid(p) == e.uid)?;
        let annotations = e.annotations.clone();
        self.shared.events.record_annotated(pod, None, EventType::Warning, core::REASON, &e.message, annotations);
        tracing::info!(
            node = %self.node, pod = %e.name, pod_uid = %e.uid, signal = %e.signal, grace_seconds = e.grace_seconds,
            message = %e.message, "Eviction manager: evicting pod"
        );
        let (done, wait) = oneshot::channel();
        let why = KillReason::Evicted { message: e.message.clone(), disruption_target: e.disruption_target };
        let grace = Duration::from_secs(e.grace_seconds.max(0) as u64);
        self.kills.send(Kill { uid: e.uid.clone(), grace, why, done }).ok()?;
        let signal = EvictionLabels { eviction_signal: e.signal.clone() };
        self.shared.metrics.evictions.get_or_create(&signal).inc();
        Some(wait)
    }
}

/// The pods the agent runs that have not finished: the only candidates for eviction.
fn active_pods(shared: &Shared) -> Vec<Arc<Pod>> {
    let records = shared.statuses.all().into_iter();
    records.filter(|r| !matches!(r.phase(), Some("Succeeded" | "Failed"))).map(|r| r.pod.clone()).collect()
}
