//! `gantry maintenance-controller`: runs the NodeMaintenance controller against the cluster
//! from `--kubeconfig`, or from the in-cluster service account when none is given, with
//! leader election and metrics flags named and defaulted as controller-runtime's.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{ArgAction, Args};
use gantry_maintenance::leader::{self, Timing};
use gantry_maintenance_controller::{self as controller, LeaderElection, Options, serve};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Where a pod's service account namespace is mounted.
const IN_CLUSTER_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

#[derive(Args, Debug)]
pub struct ControllerFlags {
    /// Elect a leader through the Lease `gantry-maintenance-controller` so that only one
    /// replica acts.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,
    /// Namespace of the leader election Lease (default: the pod's namespace in a cluster,
    /// else kube-system).
    #[arg(long)]
    leader_elect_namespace: Option<String>,
    /// Address to serve /metrics, /healthz and /readyz on; "0" disables.
    #[arg(long, default_value = ":8080")]
    metrics_bind_address: String,
}

pub fn controller(kubeconfig: Option<&Path>, flags: &ControllerFlags) -> ExitCode {
    crate::logging::init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gantry maintenance-controller: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(kubeconfig, flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(kubeconfig: Option<&Path>, flags: &ControllerFlags) -> anyhow::Result<()> {
    let metrics_address = serve::parse_bind_address(&flags.metrics_bind_address)?;
    let config = match kubeconfig {
        Some(path) => {
            let file =
                Kubeconfig::read_from(path).with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {} is not usable", path.display()))?
        }
        None => kube::Config::incluster().context("no --kubeconfig given and not running in a cluster")?,
    };
    let client = kube::Client::try_from(controller::client_config(config)).context("cannot build the API client")?;
    let host = hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "unknown".to_string());
    let identity = leader::identity(&host, &uuid::Uuid::new_v4().to_string());
    let leader_election = flags.leader_elect.then(|| LeaderElection {
        namespace: lease_namespace(flags.leader_elect_namespace.as_deref()),
        identity: identity.clone(),
        timing: Timing::default(),
    });
    let options = Options { leader_election, metrics_address, instance: Some(identity) };
    controller::run(client, options).await?;
    Ok(())
}

/// The flag, else the namespace the pod runs in, else kube-system (controller-runtime's
/// order).
fn lease_namespace(flag: Option<&str>) -> String {
    if let Some(namespace) = flag.filter(|n| !n.is_empty()) {
        return namespace.to_string();
    }
    std::fs::read_to_string(IN_CLUSTER_NAMESPACE)
        .ok()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| leader::DEFAULT_NAMESPACE.to_string())
}
