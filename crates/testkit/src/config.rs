//! Directory layout and config.toml of a private containerd instance.
//!
//! Shared by the test harness and `gantry-devenv`, so developers run exactly
//! the configuration the tests run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::cni::PodNetwork;
use crate::error::{IoContext, Result, TestkitError};
use crate::images::PAUSE_IMAGE;

/// Unix socket paths must fit `sockaddr_un.sun_path` (108 bytes with the NUL);
/// containerd also listens on `<socket>.ttrpc`, six bytes longer.
const MAX_SOCKET_PATH: usize = 107 - ".ttrpc".len();

/// Every path of one instance, all below a single base directory so that
/// cleaning up is removing (and unmounting below) that directory.
#[derive(Debug, Clone)]
pub struct Layout {
    base: PathBuf,
}

impl Layout {
    pub fn new(base: impl Into<PathBuf>) -> Result<Self> {
        let layout = Layout { base: base.into() };
        let socket = layout.socket();
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(TestkitError::Io {
                context: format!("socket path {} is too long", socket.display()),
                source: std::io::ErrorKind::InvalidInput.into(),
            });
        }
        Ok(layout)
    }

    pub fn base(&self) -> &Path {
        &self.base
    }
    pub fn root(&self) -> PathBuf {
        self.base.join("root")
    }
    pub fn state(&self) -> PathBuf {
        self.base.join("state")
    }
    pub fn socket(&self) -> PathBuf {
        self.base.join("containerd.sock")
    }
    pub fn config(&self) -> PathBuf {
        self.base.join("config.toml")
    }
    pub fn log(&self) -> PathBuf {
        self.base.join("containerd.log")
    }
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.base.join("net.d")
    }
    pub fn cni_data_dir(&self) -> PathBuf {
        self.base.join("cni-ipam")
    }
    /// Free for tests: kubelet root, manifests, pod logs.
    pub fn scratch(&self) -> PathBuf {
        self.base.join("scratch")
    }

    /// Create the directories and write config.toml plus the CNI conflist.
    pub fn prepare(&self, network: &PodNetwork, snapshotter: Snapshotter) -> Result<()> {
        for dir in [self.root(), self.state(), self.scratch(), self.cni_data_dir()] {
            std::fs::create_dir_all(&dir).ctx(|| format!("create {}", dir.display()))?;
        }
        network.write_config(&self.cni_conf_dir(), &self.cni_data_dir())?;
        let config = render_config(self, snapshotter);
        std::fs::write(self.config(), config).ctx(|| format!("write {}", self.config().display()))
    }
}

/// The snapshotter containerd unpacks images into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Snapshotter {
    Overlayfs,
    /// Plain copies: slower, but works on filesystems overlay cannot sit on.
    Native,
}

impl Snapshotter {
    pub fn name(self) -> &'static str {
        match self {
            Snapshotter::Overlayfs => "overlayfs",
            Snapshotter::Native => "native",
        }
    }

    /// Overlayfs if an overlay mount works on the filesystem holding `dir`
    /// (it fails e.g. on top of another overlay or on some tmpfs setups).
    pub fn detect(dir: &Path) -> Snapshotter {
        match try_overlay_mount(dir) {
            Ok(()) => Snapshotter::Overlayfs,
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "overlay mount failed; using native snapshotter");
                Snapshotter::Native
            }
        }
    }
}

fn try_overlay_mount(dir: &Path) -> std::io::Result<()> {
    let probe = tempfile::Builder::new().prefix(".overlay-probe").tempdir_in(dir)?;
    let sub = |name: &str| -> std::io::Result<std::ffi::CString> {
        let path = probe.path().join(name);
        std::fs::create_dir(&path)?;
        Ok(std::ffi::CString::new(path.into_os_string().into_encoded_bytes())?)
    };
    let (lower, upper, work, merged) = (sub("l")?, sub("u")?, sub("w")?, sub("m")?);
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.to_string_lossy(),
        upper.to_string_lossy(),
        work.to_string_lossy()
    );
    let options = std::ffi::CString::new(options)?;
    // SAFETY: all pointers are valid NUL-terminated strings for the call.
    let rc =
        unsafe { libc::mount(c"overlay".as_ptr(), merged.as_ptr(), c"overlay".as_ptr(), 0, options.as_ptr().cast()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: merged is a valid path we just mounted on.
    unsafe { libc::umount2(merged.as_ptr(), libc::MNT_DETACH) };
    Ok(())
}

/// TOML basic string: quote and escape the two characters that need it.
fn toml_str(value: impl AsRef<std::ffi::OsStr>) -> String {
    let text = value.as_ref().to_string_lossy();
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Plugins that only cost startup time (or log noise) here.
const DISABLED_PLUGINS: [&str; 6] = [
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
];

/// Render config.toml (format version 2, as containerd 1.6 reads it).
pub fn render_config(layout: &Layout, snapshotter: Snapshotter) -> String {
    let disabled: Vec<String> = DISABLED_PLUGINS.iter().map(toml_str).collect();
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    let mut out = String::new();
    // Each setting that is not containerd's default, and why:
    let _ = write!(
        out,
        r#"version = 2
root = {root}
state = {state}
disabled_plugins = [{disabled}]

[grpc]
  address = {socket}

[debug]
  level = "info"

# Keep the opt plugin's files private to this instance, not in /opt/containerd.
[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[{cri}]
  sandbox_image = {pause}
  # Without this every sandbox fails with "can't get final child's PID from
  # pipe": runc may not lower oom_score_adj below that of the test process.
  restrict_oom_score_adj = true
  # Netns bind mounts under our state dir, so cleanup finds leftovers there.
  netns_mounts_under_state_dir = true
  # Random port: several instances run side by side.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

  [{cri}.containerd]
    snapshotter = {snapshotter}
    default_runtime_name = "runc"

    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri}.containerd.runtimes.runc.options]
        # runc's state private to this instance rather than /run/containerd/runc.
        Root = {runc_root}
        SystemdCgroup = false

  [{cri}.cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
    max_conf_num = 1
"#,
        root = toml_str(layout.root()),
        state = toml_str(layout.state()),
        disabled = disabled.join(", "),
        socket = toml_str(layout.socket()),
        opt = toml_str(layout.root().join("opt")),
        pause = toml_str(PAUSE_IMAGE),
        snapshotter = toml_str(snapshotter.name()),
        runc_root = toml_str(layout.state().join("runc")),
        cni_bin = toml_str(crate::cni::cni_bin_dir()),
        cni_conf = toml_str(layout.cni_conf_dir()),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_mentions_the_hard_won_settings() {
        let layout = Layout::new("/tmp/x").unwrap();
        let text = render_config(&layout, Snapshotter::Native);
        for needle in [
            "version = 2",
            "restrict_oom_score_adj = true",
            "sandbox_image = \"gantry.local/pause:v1\"",
            "runtime_type = \"io.containerd.runc.v2\"",
            "snapshotter = \"native\"",
            "bin_dir = \"/usr/lib/cni\"",
            "conf_dir = \"/tmp/x/net.d\"",
            "address = \"/tmp/x/containerd.sock\"",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }

    #[test]
    fn overlong_socket_path_is_rejected() {
        assert!(Layout::new(format!("/tmp/{}", "d".repeat(100))).is_err());
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_str(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
