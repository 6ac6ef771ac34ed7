//! Test harness for Gantry's end-to-end tests.
//!
//! - [`images`]: the two tiny OCI images (`gantry.local/pause:v1`,
//!   `gantry.local/busybox:v1`) built locally, since no registry is reachable;
//! - [`Containerd`]: a private containerd per test, with its own pod network,
//!   torn down (pods, shims, mounts, bridge) on drop;
//! - [`FakeCri`]: a scriptable in-process CRI runtime for fast agent tests (no containerd,
//!   no root), with [`ManualClock`] for tests on tokio's paused clock;
//! - [`TestDevicePlugin`]: a small device plugin (real gRPC on a unix socket, devices that are
//!   files, one can be marked unhealthy, every call recorded);
//! - [`TestCsiDriver`]: a small CSI node plugin (real gRPC on a unix socket, registering
//!   through `plugins_registry`; volumes are directories bind-mounted on stage and publish;
//!   every call recorded);
//! - [`CriProxy`]: a CRI proxy in front of the real containerd that delays, fails or hangs
//!   calls on command (one method, optionally one pod), or cuts its open connections, for
//!   fault-injection tests;
//! - [`raw`]: pods started through bare CRI calls, the floor benchmarks compare
//!   Gantry against;
//! - [`vm`]: a throwaway systemd VM on cgroup v2 (`scripts/vm`), for tests that need a
//!   real systemd host.
//!
//! ```no_run
//! # async fn demo() {
//! use gantry_testkit::Containerd;
//! let Some(ctd) = Containerd::start_or_skip().await else { return };
//! let mut runtime = ctd.runtime_client().await;
//! # let _ = runtime;
//! # }
//! ```

mod cleanup;
mod cmd;
pub mod cni;
pub mod config;
pub mod containerd;
pub mod cri;
pub mod cri_proxy;
pub mod csi_driver;
pub mod device_plugin;
pub mod error;
pub mod fake_cri;
pub mod images;
pub mod pinning_images;
pub mod prereq;
pub mod raw;
pub mod vm;

pub use containerd::{Containerd, ContainerdOptions};
pub use cri_proxy::{CriFault, CriProxy, ProxyCall};
pub use csi_driver::{CsiCall, TestCsiDriver};
pub use device_plugin::{PluginCall, TestDevicePlugin};
pub use error::{Result, TestkitError};
pub use fake_cri::{FakeCri, ManualClock};
pub use images::{BUSYBOX_IMAGE, PAUSE_IMAGE};
pub use pinning_images::{PinningImageService, PullRecord};
pub use raw::{
    CLUSTER_DNS, Shape, raw_start_pods, raw_start_pods_parallel, raw_start_shaped_pods_parallel, remove_all_pods,
    remove_raw_files,
};

/// Send this crate's (and the caller's) `tracing` output to the test writer,
/// filtered by `RUST_LOG` (default `info`). Safe to call from every test.
pub fn init_test_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_test_writer()
        .try_init();
}
