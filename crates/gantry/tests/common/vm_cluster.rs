//! What the VM tests in cluster mode share: the guest's Gantry joins a test API server on the
//! host over qemu's restricted user network, through one forward to the server's port.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gantry_test_apiserver::{TestApiServer, User};

/// How long one step (the guest up, a pod running, a status reported) may take under TCG.
pub const STEP: Duration = Duration::from_secs(300);
/// The node name the guest's Gantry registers.
pub const NODE: &str = "vm-node";
/// Where the guest reaches the API server (`kubernetes` in its /etc/hosts, a name the
/// server's certificate carries).
pub const GUEST_API: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 100), 6443);

/// Polls `check` until it gives a value; panics naming `what` after `STEP`.
pub async fn until<T, F: Future<Output = Option<T>>>(what: &str, mut check: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + STEP;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The debug binary without its debug info, for a quicker trip over 9p.
pub fn stripped_gantry(dir: &Path) -> PathBuf {
    let full = PathBuf::from(env!("CARGO_BIN_EXE_gantry"));
    let out = dir.join("gantry");
    let stripped = std::process::Command::new("strip").arg("--strip-debug").arg("-o").arg(&out).arg(&full).status();
    if stripped.is_ok_and(|s| s.success()) { out } else { full }
}

/// The node's kubeconfig, pointing at the server as the guest reaches it.
pub fn guest_kubeconfig(server: &TestApiServer, dir: &Path) -> PathBuf {
    let host = server.kubeconfig(&dir.join("host"), &User::Node(NODE.into()));
    let text = std::fs::read_to_string(host).unwrap();
    assert!(text.contains(&server.url()), "the kubeconfig names {}", server.url());
    let out = dir.join("kubeconfig");
    std::fs::write(&out, text.replace(&server.url(), &format!("https://kubernetes:{}", GUEST_API.port()))).unwrap();
    out
}
