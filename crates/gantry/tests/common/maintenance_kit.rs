//! Pieces shared by the maintenance plugin and node agent e2e tests: the controller process,
//! the CRD, and running `gantry maintenance` (or `kubectl-maintenance`) as a user would.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use gantry_maintenance::api::NodeMaintenance;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, CustomResourceExt};

use crate::common::cluster::Cluster;

/// The controller process; killed on drop.
pub struct Controller(Child);

impl Controller {
    pub fn start(cluster: &Cluster, dir: &Path) -> Controller {
        let kubeconfig = cluster.admin_kubeconfig(dir);
        let log = std::fs::File::create(dir.join("maintenance-controller.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gantry"))
            .args(["maintenance-controller", &format!("--kubeconfig={}", kubeconfig.display())])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn the controller");
        Controller(child)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
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
