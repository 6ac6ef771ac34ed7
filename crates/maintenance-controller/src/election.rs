//! Leader election, the I/O side: reads and writes the `coordination.k8s.io/v1` Lease with
//! optimistic concurrency (create, or replace with the read resourceVersion; a 409 means
//! another replica won the race) and applies the pure rules of [`gantry_maintenance::leader`].

use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use gantry_maintenance::leader::{self, LEASE_NAME, Observed, Step, Timing};

/// What one replica needs to take part in the election.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    pub namespace: String,
    pub identity: String,
    pub timing: Timing,
}

/// Why a leader stopped holding the Lease.
#[derive(Debug, thiserror::Error)]
#[error("leader election lost: {0}")]
pub struct LostLease(pub String);

pub(super) struct Elector {
    api: Api<Lease>,
    config: LeaderElection,
    origin: Instant,
    observed: Option<Observed>,
    resource_version: Option<String>,
    reported_holder: Option<String>,
}

impl Elector {
    pub fn new(client: Client, config: LeaderElection) -> Elector {
        Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            origin: Instant::now(),
            observed: None,
            resource_version: None,
            reported_holder: None,
        }
    }

    fn now_nanos(&self) -> u128 {
        self.origin.elapsed().as_nanos()
    }

    /// Blocks until this replica holds the Lease, trying every retry period.
    pub async fn acquire(&mut self) {
        let (namespace, identity) = (&self.config.namespace.clone(), &self.config.identity.clone());
        tracing::info!(lease = LEASE_NAME, namespace, identity, "attempting to acquire leader lease");
        loop {
            match tokio::time::timeout(self.config.timing.renew_deadline, self.try_once()).await {
                Ok(Ok(true)) => {
                    tracing::info!(lease = LEASE_NAME, namespace, identity, "successfully acquired lease");
                    return;
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(lease = LEASE_NAME, error = %e, "error retrieving or updating the lease"),
                Err(_) => tracing::warn!(lease = LEASE_NAME, "timed out acquiring the lease"),
            }
            tokio::time::sleep(self.config.timing.retry_period).await;
        }
    }

    /// Renews every retry period; returns once renewing failed for the renew deadline or
    /// another replica holds the Lease. The caller must stop acting at once.
    pub async fn renew_until_lost(&mut self) -> LostLease {
        let timing = self.config.timing;
        let mut last_renew = self.now_nanos();
        loop {
            tokio::time::sleep(timing.retry_period).await;
            let left = timing.renew_deadline.saturating_sub(Duration::from_nanos(
                (self.now_nanos().saturating_sub(last_renew)).min(u64::MAX as u128) as u64,
            ));
            match tokio::time::timeout(left, self.try_once()).await {
                Ok(Ok(true)) => last_renew = self.now_nanos(),
                Ok(Ok(false)) => {
                    if let Some(holder) = self.holder().filter(|h| !h.is_empty() && *h != self.config.identity) {
                        return LostLease(format!("the lease is now held by {holder}"));
                    }
                }
                Ok(Err(e)) => tracing::warn!(lease = LEASE_NAME, error = %e, "failed to renew the lease"),
                Err(_) => {}
            }
            if leader::must_step_down(last_renew, self.now_nanos(), &timing) {
                return LostLease(format!("could not renew within {:?}", timing.renew_deadline));
            }
        }
    }

    fn holder(&self) -> Option<String> {
        self.observed.as_ref()?.spec.holder_identity.clone()
    }

    /// Gives the Lease up so a successor need not wait for it to expire. Best effort: a
    /// failure only means the successor waits the lease duration.
    pub async fn release(&mut self) {
        let Some(observed) = self.observed.clone() else { return };
        if observed.spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        let spec = leader::released(&observed.spec, Timestamp::now());
        match self.write(spec).await {
            Ok(true) => tracing::info!(lease = LEASE_NAME, "released the leader lease"),
            Ok(false) => tracing::info!(lease = LEASE_NAME, "the lease changed meanwhile; not released"),
            Err(e) => tracing::warn!(lease = LEASE_NAME, error = %e, "cannot release the lease"),
        }
    }

    /// One read-decide-write round; `true` when we hold the Lease afterwards.
    async fn try_once(&mut self) -> Result<bool, kube::Error> {
        let read = self.api.get_opt(LEASE_NAME).await?;
        let now = self.now_nanos();
        match read {
            None => {
                self.observed = None;
                self.resource_version = None;
            }
            Some(lease) => {
                let spec = lease.spec.unwrap_or_default();
                let changed = self.observed.as_ref().is_none_or(|o| o.spec != spec);
                if changed {
                    self.observed = Some(Observed { spec, since_nanos: now });
                }
                self.resource_version = lease.metadata.resource_version;
            }
        }
        let step = leader::try_acquire_or_renew(
            &self.config.identity,
            self.observed.as_ref(),
            now,
            Timestamp::now(),
            &self.config.timing,
        );
        match step {
            Step::Create(spec) => self.create(spec).await,
            Step::Write(spec) => self.write(spec).await,
            Step::Wait { holder } => {
                if self.reported_holder.as_deref() != Some(holder.as_str()) {
                    tracing::info!(lease = LEASE_NAME, holder, "the lease is held by another replica; waiting");
                    self.reported_holder = Some(holder);
                }
                Ok(false)
            }
        }
    }

    async fn create(&mut self, spec: LeaseSpec) -> Result<bool, kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE_NAME.to_string()),
                namespace: Some(self.config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(spec),
        };
        self.store_result(self.api.create(&PostParams::default(), &lease).await)
    }

    /// Replaces the Lease, with the resourceVersion we read as precondition.
    async fn write(&mut self, spec: LeaseSpec) -> Result<bool, kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE_NAME.to_string()),
                namespace: Some(self.config.namespace.clone()),
                resource_version: self.resource_version.clone(),
                ..Default::default()
            },
            spec: Some(spec),
        };
        self.store_result(self.api.replace(LEASE_NAME, &PostParams::default(), &lease).await)
    }

    fn store_result(&mut self, result: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
        match result {
            Ok(lease) => {
                let spec = lease.spec.unwrap_or_default();
                let ours = spec.holder_identity.as_deref() == Some(self.config.identity.as_str());
                self.observed = Some(Observed { spec, since_nanos: self.now_nanos() });
                self.resource_version = lease.metadata.resource_version;
                Ok(ours)
            }
            // Another replica wrote first (create: AlreadyExists; replace: Conflict).
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}
