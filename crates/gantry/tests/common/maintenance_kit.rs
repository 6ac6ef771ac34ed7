//! Pieces shared by the maintenance e2e tests: the controller process, the CRD, running
//! `gantry maintenance` (or `kubectl-maintenance`) as a user would, and a kubelet stand-in for
//! nodes without an agent.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_maintenance::api::NodeMaintenance;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, CustomResourceExt};

use crate::common::Process;
use crate::common::cluster::Cluster;

/// The controller process; killed on drop.
pub struct Controller {
    process: Process,
}

impl Controller {
    /// One controller, without leader election or metrics (tests run in parallel).
    pub fn start(cluster: &Cluster, dir: &Path) -> Controller {
        Self::start_as(cluster, dir, "maintenance-controller", &["--leader-elect=false", "--metrics-bind-address=0"])
    }

    pub fn start_as(cluster: &Cluster, dir: &Path, name: &str, flags: &[&str]) -> Controller {
        let kubeconfig = cluster.admin_kubeconfig(dir);
        let mut args = vec!["maintenance-controller".to_string(), format!("--kubeconfig={}", kubeconfig.display())];
        args.extend(flags.iter().map(|f| f.to_string()));
        Controller { process: Process::spawn(&args, &dir.join(format!("{name}.log"))) }
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    /// SIGKILL, as a crash or a node failure would.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// SIGTERM, as the kubelet stops a pod; then the exit status, or `None` if the process
    /// did not exit within the deadline.
    pub async fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let pid = self.process.pid()?.to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().ok()?;
        assert!(status.success(), "kill -TERM failed");
        self.exit().await
    }

    /// Waits (without blocking the in-process API server) for the process to exit on its own.
    pub async fn exit(&mut self) -> Option<std::process::ExitStatus> {
        self.process.pid()?;
        let start = Instant::now();
        while start.elapsed() < crate::common::DEADLINE {
            if let Some(status) = self.process.try_exit() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

pub async fn install_crd(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.create(&PostParams::default(), &NodeMaintenance::crd()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("cannot create the NodeMaintenance CRD: {e}"),
    }
}

/// How the plugin is invoked.
pub enum Invocation<'a> {
    /// `gantry maintenance ... --kubeconfig PATH`.
    Gantry(&'a Path),
    /// `kubectl-maintenance ...` through a symlink, with `KUBECONFIG` set, as kubectl runs it.
    Kubectl { link_dir: &'a Path, kubeconfig: &'a Path },
}

pub struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the plugin without blocking the runtime (the test API server may run on it).
pub async fn plugin(how: &Invocation<'_>, args: &[&str]) -> Output {
    let mut cmd = match how {
        Invocation::Gantry(kubeconfig) => {
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gantry"));
            cmd.arg("maintenance").args(args).arg(format!("--kubeconfig={}", kubeconfig.display()));
            cmd.env_remove("KUBECONFIG");
            cmd
        }
        Invocation::Kubectl { link_dir, kubeconfig } => {
            let mut cmd = tokio::process::Command::new(kubectl_link(link_dir));
            cmd.args(args).env("KUBECONFIG", kubeconfig);
            cmd
        }
    };
    let out = cmd.output().await.expect("run the plugin");
    Output {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `<dir>/kubectl-maintenance` → the gantry binary, as a user installs the plugin.
pub fn kubectl_link(dir: &Path) -> PathBuf {
    let link = dir.join("kubectl-maintenance");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_gantry"), &link).unwrap();
    }
    link
}

/// Stands in for the kubelet of one node: records the order in which its pods start
/// terminating, and (unless held) finishes their deletion as a kubelet does once the
/// containers stopped. The next drain entry cannot start before it does, so the recorded
/// order is exactly the eviction order.
pub struct KubeletStandIn {
    order: Arc<Mutex<Vec<String>>>,
    hold: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl KubeletStandIn {
    pub fn start(pods: Api<Pod>, node: &str, hold: bool) -> KubeletStandIn {
        let (order, hold) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(hold)));
        let (seen, held) = (order.clone(), hold.clone());
        let on_node = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
        let task = tokio::spawn(async move {
            loop {
                for pod in pods.list(&on_node).await.map(|l| l.items).unwrap_or_default() {
                    if pod.metadata.deletion_timestamp.is_none() {
                        continue;
                    }
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    {
                        let mut seen = seen.lock().unwrap();
                        if !seen.contains(&name) {
                            seen.push(name.clone());
                        }
                    }
                    if !held.load(Ordering::SeqCst) {
                        let _ = pods.delete(&name, &DeleteParams::default().grace_period(0)).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        KubeletStandIn { order, hold, task }
    }

    pub fn order(&self) -> Vec<String> {
        self.order.lock().unwrap().clone()
    }

    pub fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
    }
}

impl Drop for KubeletStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}
