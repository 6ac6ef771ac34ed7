//! A private containerd process per test (or per `gantry-devenv` run).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gantry_cri::api::image_service_client::ImageServiceClient;
use gantry_cri::api::runtime_service_client::RuntimeServiceClient;
use gantry_cri::api::{ImageSpec, ImageStatusRequest, StatusRequest};
use tempfile::TempDir;
use tonic::transport::Channel;

use crate::cni::{OwnerRecord, PodNetwork};
use crate::config::{Layout, Snapshotter};
use crate::error::{IoContext, Result, TestkitError};
use crate::images::{self, TestImage};
use crate::{cleanup, cri, prereq};

const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
const IMAGE_TIMEOUT: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Bound on the CRI teardown at drop; past it the process sweep takes over.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Short, fixed prefix of temporary instance dirs (socket paths must stay
/// under 108 bytes); also how orphaned ones are recognised.
const TEMP_PREFIX: &str = "gantry-ctd-";
/// Where temporary instance dirs may be created, preferred first.
const TEMP_PARENTS: [&str; 2] = ["/dev/shm", "/tmp"];

/// How to start an instance; the defaults are what tests want.
#[derive(Debug, Clone, Default)]
pub struct ContainerdOptions {
    /// Persistent base directory (kept on drop), for `gantry-devenv`.
    /// `None`: a fresh temporary directory, removed on drop.
    pub dir: Option<PathBuf>,
    /// Image tarball cache; `None`: [`images::default_cache_dir`].
    pub image_cache: Option<PathBuf>,
}

/// A running containerd with the CRI plugin, our pod network and both test
/// images imported. Dropping it removes every pod, stops containerd, kills
/// leftover shims, unmounts, deletes the bridge and (if temporary) the directory.
#[derive(Debug)]
pub struct Containerd {
    layout: Layout,
    snapshotter: Snapshotter,
    child: Child,
    startup: Duration,
    // Dropped after Drop::drop, in this order: the bridge goes (and the subnet
    // is released) before the directory is removed.
    network: PodNetwork,
    _temp: Option<TempDir>,
}

impl Containerd {
    /// Start an instance, or `Ok(None)` after printing a SKIPPED line if this
    /// machine cannot run one (panics instead when `CI` is set).
    pub async fn start() -> Result<Option<Self>> {
        if let Some(reason) = prereq::missing_prerequisite() {
            prereq::skip_or_panic(&reason);
            return Ok(None);
        }
        Self::start_with(ContainerdOptions::default()).await.map(Some)
    }

    /// For tests: `let Some(ctd) = Containerd::start_or_skip().await else { return };`
    /// A failure to start when the prerequisites are present is a panic.
    pub async fn start_or_skip() -> Option<Self> {
        match Self::start().await {
            Ok(ctd) => ctd,
            Err(error) => panic!("starting containerd failed: {error}"),
        }
    }

    /// Start an instance without the prerequisite check.
    pub async fn start_with(options: ContainerdOptions) -> Result<Self> {
        let started = Instant::now();
        let (layout, temp) = base_dir(options.dir)?;
        let (network, orphan) = PodNetwork::allocate()?;
        if let Some(orphan) = orphan {
            reap_orphan(&orphan);
        }
        let snapshotter = Snapshotter::detect(layout.base());
        layout.prepare(&network, snapshotter)?;

        // Build (or find cached) images while containerd boots.
        let cache = options.image_cache.unwrap_or_else(images::default_cache_dir);
        let build = tokio::task::spawn_blocking(move || images::ensure_images(&cache));

        let child = spawn(&layout)?;
        // From here on Drop cleans up whatever fails next.
        let mut ctd = Containerd { layout, snapshotter, child, startup: Duration::ZERO, network, _temp: temp };
        ctd.network
            .record_owner(&OwnerRecord { base: ctd.layout.base().to_path_buf(), containerd_pid: ctd.child.id() })?;
        ctd.wait_ready().await?;
        let ready_ms = started.elapsed().as_millis() as u64;
        let built = build.await.expect("image build task panicked")?;
        ctd.import(&built).await?;
        ctd.startup = started.elapsed();
        tracing::info!(
            endpoint = %ctd.endpoint(),
            pid = ctd.child.id(),
            subnet = %ctd.network.subnet(),
            bridge = %ctd.network.bridge(),
            snapshotter = snapshotter.name(),
            ready_ms,
            startup_ms = ctd.startup.as_millis() as u64,
            "containerd ready"
        );
        Ok(ctd)
    }

    /// Import the images and wait until CRI lists them.
    async fn import(&self, built: &[images::BuiltImage]) -> Result<()> {
        images::import_images(&self.socket_path(), self.snapshotter.name(), built).await?;
        self.wait_images_visible().await
    }

    /// Build and import a tiny throwaway image named `reference` (see
    /// [`images::build_scratch_image`]).
    pub async fn import_scratch_image(&self, reference: &str, marker: &str) -> Result<()> {
        let path = images::build_scratch_image(reference, marker, &self.dir())?;
        images::import_tarball(&self.socket_path(), self.snapshotter.name(), &path).await
    }

    /// Import an image-layout tarball built elsewhere (`scripts/image`, say).
    pub async fn import_tarball(&self, path: &Path) -> Result<()> {
        images::import_tarball(&self.socket_path(), self.snapshotter.name(), path).await
    }

    /// CRI endpoint URL, e.g. `unix:///tmp/gantry-ctd-xyz/containerd.sock`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket_path().display())
    }

    pub fn socket_path(&self) -> PathBuf {
        self.layout.socket()
    }

    /// Scratch directory for the test: kubelet root, manifests, pod logs.
    pub fn dir(&self) -> PathBuf {
        self.layout.scratch()
    }

    /// A cgroup root private to this instance (`--cgroup-root` for a node agent using it), so the
    /// pod cgroups the agent leaves behind are removed with the instance.
    pub fn cgroup_root(&self) -> String {
        cgroup_root(&self.layout)
    }

    /// All paths of this instance (root, state, config, log, ...).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The pod network (bridge, subnet) this instance's pods are attached to.
    pub fn network(&self) -> &PodNetwork {
        &self.network
    }

    pub fn snapshotter(&self) -> Snapshotter {
        self.snapshotter
    }

    /// Wall time from `start` until the images were visible through CRI.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops containerd (SIGTERM, as a service manager would) and starts it again on the same
    /// directories and socket, as an upgrade or a crash-restart does; the pods' shims, and so
    /// the containers, live on. Returns how long containerd was not answering.
    pub async fn restart(&mut self) -> Result<Duration> {
        let stopped = Instant::now();
        self.terminate();
        self.child = spawn(&self.layout)?;
        self.network
            .record_owner(&OwnerRecord { base: self.layout.base().to_path_buf(), containerd_pid: self.child.id() })?;
        self.wait_ready().await?;
        tracing::info!(pid = self.child.id(), "containerd restarted");
        Ok(stopped.elapsed())
    }

    /// containerd's exit status if it has exited (it should not on its own).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// PIDs of the shim processes currently serving this instance.
    pub fn shim_pids(&self) -> Vec<i32> {
        cleanup::shims_of(&self.socket_path())
    }

    /// The containerd log file (its stdout and stderr).
    pub fn log_path(&self) -> PathBuf {
        self.layout.log()
    }

    /// The last `n` lines of the containerd log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.layout.log(), n)
    }

    /// A raw CRI runtime client. Panics, with the containerd log tail, if the
    /// socket cannot be reached: this is test scaffolding, not a code path.
    pub async fn runtime_client(&self) -> RuntimeServiceClient<Channel> {
        cri::runtime_client(&self.socket_path())
            .await
            .unwrap_or_else(|e| panic!("{e}\ncontainerd log:\n{}", self.log_tail(40)))
    }

    /// A raw CRI image client; panics like [`Self::runtime_client`].
    pub async fn image_client(&self) -> ImageServiceClient<Channel> {
        cri::image_client(&self.socket_path())
            .await
            .unwrap_or_else(|e| panic!("{e}\ncontainerd log:\n{}", self.log_tail(40)))
    }

    /// Poll until CRI reports both the runtime and the pod network ready;
    /// the socket appears before the CRI plugin and CNI config are loaded.
    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().ctx(|| "wait for containerd".into())? {
                return Err(TestkitError::ContainerdExited { status: status.to_string(), log: self.log_tail(40) });
            }
            if self.cri_ready().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(timeout("containerd CRI readiness", self.log_tail(40)));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    async fn cri_ready(&self) -> bool {
        if !self.socket_path().exists() {
            return false;
        }
        let Ok(mut client) = cri::runtime_client(&self.socket_path()).await else {
            return false;
        };
        let Ok(response) = client.status(StatusRequest { verbose: false }).await else {
            return false;
        };
        let conditions = response.into_inner().status.map(|s| s.conditions).unwrap_or_default();
        ["RuntimeReady", "NetworkReady"].iter().all(|kind| conditions.iter().any(|c| c.r#type == *kind && c.status))
    }

    /// The CRI plugin learns about imported images from containerd events, so
    /// they show up shortly after `ctr` returns, not necessarily at once.
    async fn wait_images_visible(&self) -> Result<()> {
        let mut client = cri::image_client(&self.socket_path()).await?;
        for image in TestImage::ALL {
            let deadline = Instant::now() + IMAGE_TIMEOUT;
            while !image_visible(&mut client, image.reference()).await? {
                if Instant::now() > deadline {
                    return Err(TestkitError::ImageNotVisible { image: image.reference().into() });
                }
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
        Ok(())
    }

    /// Remove all pods through CRI; run on a private runtime because Drop
    /// cannot await and may be called from inside (or outside) any runtime.
    fn teardown_pods(&self) {
        let socket = self.socket_path();
        let outcome = block_on_fresh_runtime(async move {
            let client = cri::runtime_client(&socket).await?;
            cri::remove_sandboxes(&client, &[]).await
        });
        match outcome {
            Some(Ok(0)) => {}
            Some(Ok(n)) => tracing::debug!(sandboxes = n, "removed sandboxes at shutdown"),
            Some(Err(error)) => tracing::warn!(%error, "CRI teardown failed"),
            None => tracing::warn!("CRI teardown timed out"),
        }
    }

    /// SIGTERM, then SIGKILL if containerd has not exited within the grace time.
    fn terminate(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: plain syscall on our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        tracing::warn!(pid, "containerd ignored SIGTERM; killing");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- containerd log ({}), last 50 lines ---\n{}", self.log_path().display(), self.log_tail(50));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            self.teardown_pods();
            self.terminate();
        }
        cleanup::kill_shims(&self.socket_path());
        cleanup::unmount_below(self.layout.base());
        cleanup::remove_container_cgroups(&self.layout.state());
        cleanup::remove_cgroup_tree(&self.cgroup_root());
        if let Err(error) = self.network.clear_owner() {
            tracing::warn!(%error, "could not clear owner record");
        }
        tracing::debug!(dir = %self.layout.base().display(), "containerd stopped");
    }
}

fn cgroup_root(layout: &Layout) -> String {
    let name = layout.base().file_name().unwrap_or_default().to_string_lossy().into_owned();
    format!("/gantry-e2e/{name}")
}

/// Clean up after an instance whose owning process died without dropping it
/// (killed test run): its containerd, shims and containers may still run and
/// its mounts remain. Only temporary directories are deleted.
fn reap_orphan(orphan: &OwnerRecord) {
    let Ok(layout) = Layout::new(&orphan.base) else {
        return;
    };
    if cleanup::process_has_arg(orphan.containerd_pid, layout.config().as_os_str()) {
        // SAFETY: plain syscall; the pid was verified to be that containerd.
        unsafe { libc::kill(orphan.containerd_pid as i32, libc::SIGKILL) };
    }
    cleanup::kill_shims(&layout.socket());
    cleanup::unmount_below(layout.base());
    cleanup::remove_container_cgroups(&layout.state());
    cleanup::remove_cgroup_tree(&cgroup_root(&layout));
    let temporary = orphan.base.parent().is_some_and(|parent| TEMP_PARENTS.iter().any(|p| parent == Path::new(p)))
        && orphan.base.file_name().is_some_and(|name| name.to_string_lossy().starts_with(TEMP_PREFIX));
    if temporary {
        let _ = std::fs::remove_dir_all(&orphan.base);
    }
    tracing::warn!(dir = %orphan.base.display(), pid = orphan.containerd_pid, "reaped orphaned containerd instance");
}

/// A fresh temp dir, or the caller's persistent dir.
fn base_dir(dir: Option<PathBuf>) -> Result<(Layout, Option<TempDir>)> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).ctx(|| format!("create {}", dir.display()))?;
            let dir = dir.canonicalize().ctx(|| format!("resolve {}", dir.display()))?;
            refuse_if_served(&Layout::new(&dir)?.socket())?;
            Ok((Layout::new(dir)?, None))
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix(TEMP_PREFIX)
                .tempdir_in(temp_parent())
                .ctx(|| "create containerd temp dir".into())?;
            Ok((Layout::new(temp.path())?, Some(temp)))
        }
    }
}

/// Where temporary instances live: /dev/shm (tmpfs) when it has room, else
/// /tmp. On this kind of VM's ext4 each symlink costs ~0.3 ms and every bolt
/// commit an fsync; on tmpfs image import and pod startup are several times
/// faster (busybox unpack: 210 ms -> 40 ms).
fn temp_parent() -> &'static Path {
    const MIN_FREE: u64 = 1 << 30;
    let [shm, tmp] = TEMP_PARENTS;
    // SAFETY: statvfs fills the zeroed struct; the path is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::statvfs(c"/dev/shm".as_ptr(), &mut stat) } == 0;
    let free = stat.f_bavail as u64 * stat.f_frsize as u64;
    Path::new(if ok && free >= MIN_FREE { shm } else { tmp })
}

/// A persistent dir may still be in use by another instance; taking over its
/// socket would silently cut that one off.
fn refuse_if_served(socket: &Path) -> Result<()> {
    if std::os::unix::net::UnixStream::connect(socket).is_ok() {
        return Err(TestkitError::Io {
            context: format!("another containerd is already serving {}", socket.display()),
            source: std::io::ErrorKind::AddrInUse.into(),
        });
    }
    Ok(())
}

fn spawn(layout: &Layout) -> Result<Child> {
    // Appended to: a restarted containerd keeps the earlier log.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(layout.log())
        .ctx(|| format!("open {}", layout.log().display()))?;
    let log_err = log.try_clone().ctx(|| "clone log file handle".into())?;
    let child = Command::new("containerd")
        .arg("--config")
        .arg(layout.config())
        .env("PATH", prereq::tool_path())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        // Own process group: a Ctrl-C at the terminal reaches only us, and we
        // shut containerd down in order (pods first).
        .process_group(0)
        .spawn()
        .ctx(|| "spawn containerd".into())?;
    tracing::debug!(pid = child.id(), config = %layout.config().display(), "spawned containerd");
    Ok(child)
}

async fn image_visible(client: &mut ImageServiceClient<Channel>, reference: &str) -> Result<bool> {
    let request =
        ImageStatusRequest { image: Some(ImageSpec { image: reference.into(), ..Default::default() }), verbose: false };
    let response = client.image_status(request).await.map_err(TestkitError::cri("ImageStatus"))?;
    Ok(response.into_inner().image.is_some())
}

fn timeout(what: &str, log: String) -> TestkitError {
    TestkitError::Timeout { what: format!("{what}; containerd log tail:\n{log}"), after: STARTUP_TIMEOUT }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Run `future` to completion on a new single-threaded runtime in a scoped
/// thread (so it works whether or not the caller is inside a runtime);
/// `None` if it did not finish within [`TEARDOWN_TIMEOUT`].
fn block_on_fresh_runtime<T: Send>(future: impl Future<Output = T> + Send) -> Option<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
                runtime.block_on(async { tokio::time::timeout(TEARDOWN_TIMEOUT, future).await.ok() })
            })
            .join()
            .ok()
            .flatten()
    })
}
