//! `gantry maintenance-controller`: runs the NodeMaintenance controller against the cluster
//! from `--kubeconfig`, or from the in-cluster service account when none is given.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub fn controller(kubeconfig: Option<&Path>) -> ExitCode {
    crate::logging::init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gantry maintenance-controller: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(kubeconfig)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(kubeconfig: Option<&Path>) -> anyhow::Result<()> {
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
    let client = kube::Client::try_from(gantry_maintenance::controller::client_config(config))
        .context("cannot build the API client")?;
    gantry_maintenance::controller::run(client).await;
    Ok(())
}
