//! The API server the cluster-mode tests talk to: the in-process test server by default, or
//! a real cluster when `GANTRY_E2E_KUBECONFIG` names a kubeconfig (with rights to create
//! Nodes, Pods and read Events). Against a real cluster each test uses its own node name and
//! removes its Node at the end; tests that must stop the API server are skipped there.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use gantry_test_apiserver::{TestApiServer, User};

pub const REAL_CLUSTER_ENV: &str = "GANTRY_E2E_KUBECONFIG";

pub enum Cluster {
    Test(TestApiServer),
    Real(PathBuf),
}

impl Cluster {
    pub async fn start() -> Cluster {
        match std::env::var_os(REAL_CLUSTER_ENV) {
            Some(path) => Cluster::Real(PathBuf::from(path)),
            None => Cluster::Test(TestApiServer::start().await),
        }
    }

    /// A node name no other test (or test run) uses on this API server.
    pub fn node_name(&self) -> String {
        self.unique_node_name(super::NODE)
    }

    /// `name` on the private test server; a name unique to this test run on a real cluster.
    pub fn unique_node_name(&self, name: &str) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        match self {
            Cluster::Test(_) => name.to_string(),
            Cluster::Real(_) => format!("gantry-e2e-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// The test server, for cases only it can stage (stopping it, say); `None`, with a
    /// SKIPPED line naming the case, on a real cluster.
    pub fn test_server(&mut self, case: &str) -> Option<&mut TestApiServer> {
        match self {
            Cluster::Test(server) => Some(server),
            Cluster::Real(_) => {
                eprintln!("SKIPPED {case}: needs the test API server (it stops and restarts it)");
                None
            }
        }
    }

    /// The kubeconfig the node agent uses: the node's own identity on the test server, the
    /// given kubeconfig on a real cluster.
    pub fn node_kubeconfig(&self, dir: &Path, node: &str) -> PathBuf {
        match self {
            Cluster::Test(server) => server.kubeconfig(dir, &User::Node(node.to_string())),
            Cluster::Real(path) => path.clone(),
        }
    }

    /// A kubeconfig with cluster-admin rights, for processes the test starts (controllers).
    pub fn admin_kubeconfig(&self, dir: &Path) -> PathBuf {
        match self {
            Cluster::Test(server) => server.kubeconfig(dir, &User::Admin),
            Cluster::Real(path) => path.clone(),
        }
    }

    pub async fn admin(&self) -> kube::Client {
        match self {
            Cluster::Test(server) => server.client(&User::Admin).await,
            Cluster::Real(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("read GANTRY_E2E_KUBECONFIG");
                let config =
                    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("kubeconfig");
                kube::Client::try_from(config).expect("client")
            }
        }
    }

    /// Removes what a test left on a real cluster: the pods bound to its node, then the Node.
    pub async fn cleanup(&self, node: &str) {
        if let Cluster::Test(_) = self {
            return; // the whole server goes away with the test
        }
        let client = self.admin().await;
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(client.clone());
        let selector = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
        for pod in pods.list(&selector).await.map(|l| l.items).unwrap_or_default() {
            let namespaced: kube::Api<k8s_openapi::api::core::v1::Pod> =
                kube::Api::namespaced(client.clone(), pod.metadata.namespace.as_deref().unwrap_or("default"));
            let name = pod.metadata.name.unwrap_or_default();
            let _ = namespaced.delete(&name, &kube::api::DeleteParams::default().grace_period(0)).await;
        }
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        let _ = nodes.delete(node, &Default::default()).await;
    }
}

/// A containerd, an API server (the test server, or a real one) and the node name to use.
pub async fn setup() -> Option<(super::Env, Cluster)> {
    let cluster = Cluster::start().await;
    let env = super::Env::start_as(&cluster.node_name()).await?;
    Some((env, cluster))
}

/// `gantry kubelet` joining the cluster as the environment's node.
pub fn start_node(env: &super::Env, cluster: &Cluster) -> super::Gantry {
    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    env.kubelet(&[&format!("--kubeconfig={}", kubeconfig.display())])
}
