//! A throwaway systemd host for the end-to-end tests that need one: a Debian 12 VM with systemd
//! as PID 1 on the unified cgroup v2 hierarchy, containerd and runc from Debian, booted by
//! `scripts/vm` under qemu. The image is built once per machine (`scripts/vm build`, run by
//! `scripts/test`) and every boot starts from it unchanged.
//!
//! A test hands the VM a guest script and files over a 9p share; the script runs as root once
//! the system is up, writes what it saw under `results/`, and the VM powers off. The test then
//! asserts on the results from the host.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{IoContext, Result, TestkitError};

/// `scripts/vm` in this source tree.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/vm")
}

/// Where the image lives: `$VM_DIR`, else `/var/tmp/gantry-vm` (as in `scripts/vm`).
pub fn image_dir() -> PathBuf {
    std::env::var_os("VM_DIR").map_or_else(|| PathBuf::from("/var/tmp/gantry-vm"), PathBuf::from)
}

/// Why VM tests cannot run here, or `None` if they can.
pub fn missing_prerequisite() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    if !crate::cmd::on_path_in("qemu-system-x86_64", &crate::prereq::tool_path()) {
        return Some("qemu-system-x86_64 is missing (scripts/vm build installs it)".into());
    }
    let dir = image_dir();
    let built = ["build.stamp", "rootfs.img", "kernel", "initrd.img"].iter().all(|f| dir.join(f).is_file());
    (!built).then(|| format!("no VM image in {} (build it with scripts/vm build)", dir.display()))
}

/// One boot of the VM.
#[derive(Debug)]
pub struct VmRun {
    /// The run directory: `share/` (the guest's `/mnt/host`), `console.log`, `vm.log`.
    pub dir: PathBuf,
    /// The guest script's exit code (124: timed out, 125: the VM failed).
    pub exit: i32,
    /// From starting qemu until it exited.
    pub elapsed: Duration,
}

impl VmRun {
    /// What the guest wrote under `/mnt/host/results`.
    pub fn results(&self) -> PathBuf {
        self.dir.join("share/results")
    }

    /// A results file, empty if the guest did not write it.
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.results().join(name)).unwrap_or_default()
    }

    /// The guest's uptime in seconds when the script started: the boot time.
    pub fn boot_seconds(&self) -> Option<f64> {
        self.read("uptime-at-script-start").trim().parse().ok()
    }

    /// What the run printed: the guest script's output, then the harness's and the console's.
    pub fn report(&self) -> String {
        let file = |name: &str| std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        format!(
            "--- guest script output ---\n{}\n--- scripts/vm ---\n{}\n--- console (tail) ---\n{}",
            self.read("output.log"),
            file("vm.log"),
            tail(&file("console.log"), 40)
        )
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A TCP port of the host the guest may reach, and nothing else: qemu's user networking in
/// restricted mode, with one forward from `guest` (an address on the guest's 10.0.2.0/24
/// network) to `127.0.0.1:host_port`. The guest configures its interface itself.
#[derive(Debug, Clone, Copy)]
pub struct Forward {
    pub guest: std::net::SocketAddrV4,
    pub host_port: u16,
}

/// Boots the VM, runs `guest_script` in it with `files` (copied by file name) on the share,
/// and waits until it powered off, at most `timeout`. `run_dir` must not exist yet.
pub fn run(guest_script: &Path, files: &[PathBuf], run_dir: &Path, timeout: Duration) -> Result<VmRun> {
    spawn(guest_script, files, run_dir, timeout, None)?.wait()
}

/// A VM booting or running; [`wait`](Self::wait) for it to power off.
#[derive(Debug)]
pub struct Running {
    dir: PathBuf,
    child: std::process::Child,
    started: Instant,
}

impl Running {
    /// The guest's `/mnt/host`, which the test may read and write while the VM runs.
    pub fn share(&self) -> PathBuf {
        self.dir.join("share")
    }

    /// Waits until the VM powered off (`scripts/vm` enforces the timeout).
    pub fn wait(mut self) -> Result<VmRun> {
        let status =
            self.child.wait().map_err(|source| TestkitError::Io { context: "wait for scripts/vm".into(), source })?;
        let elapsed = self.started.elapsed();
        let exit = status.code().unwrap_or(125);
        tracing::info!(exit, elapsed_ms = elapsed.as_millis() as u64, dir = %self.dir.display(), "VM run finished");
        Ok(VmRun { dir: self.dir, exit, elapsed })
    }
}

/// Starts what [`run`] does without waiting, with the guest's network `forward` if any.
pub fn spawn(
    guest_script: &Path,
    files: &[PathBuf],
    run_dir: &Path,
    timeout: Duration,
    forward: Option<Forward>,
) -> Result<Running> {
    std::fs::create_dir_all(run_dir).ctx(|| format!("create {}", run_dir.display()))?;
    let log = std::fs::File::create(run_dir.join("vm.log")).ctx(|| "create vm.log".into())?;
    let mut cmd = Command::new(script());
    cmd.arg("run")
        .arg(guest_script)
        .args(files)
        .env("PATH", crate::prereq::tool_path())
        .env("VM_RUN_DIR", run_dir)
        .env("VM_TIMEOUT", timeout.as_secs().to_string())
        .stdout(log.try_clone().ctx(|| "dup vm.log".into())?)
        .stderr(log)
        .stdin(Stdio::null());
    if let Some(Forward { guest, host_port }) = forward {
        cmd.env("VM_FORWARD", format!("{guest}={host_port}"));
    }
    let started = Instant::now();
    let child = cmd.spawn().map_err(|source| TestkitError::Io { context: "spawn scripts/vm run".into(), source })?;
    Ok(Running { dir: run_dir.to_path_buf(), child, started })
}

/// The file next to a guest script that holds what the guest scripts share; it goes on the
/// share as `/mnt/host/lib.sh`.
const GUEST_LIBRARY: &str = "lib.sh";

/// One boot for a test file's cases: `None` (SKIPPED, or a failure under `CI=true`) when the
/// VM cannot run here. Otherwise the guest gets `guest_script`, the test images and the files
/// `files` makes in a fresh directory named after `test`; the run's figures go to stderr.
pub fn boot_for_test(
    test: &str,
    guest_script: &Path,
    files: impl FnOnce(&Path) -> Vec<PathBuf>,
    timeout: Duration,
) -> Option<VmRun> {
    Some(finish_for_test(start_for_test(test, guest_script, files, timeout, None)?))
}

/// As [`boot_for_test`], but returns once the VM is starting, for a test that works with the
/// guest while it runs (over the share, or the `forward`); end with [`finish_for_test`].
pub fn start_for_test(
    test: &str,
    guest_script: &Path,
    files: impl FnOnce(&Path) -> Vec<PathBuf>,
    timeout: Duration,
    forward: Option<Forward>,
) -> Option<Running> {
    crate::init_test_tracing();
    if let Some(reason) = missing_prerequisite() {
        crate::prereq::skip_or_panic(&reason);
        return None;
    }
    let images = crate::images::ensure_images(&crate::images::default_cache_dir()).expect("build the test images");
    let dir = tempfile::Builder::new().prefix(&format!("{test}-")).tempdir().expect("a run directory").keep();
    let mut shared = files(&dir);
    shared.extend(images.into_iter().map(|i| i.path));
    // The guest scripts' shared helpers, which they source from the share.
    let library = guest_script.with_file_name(GUEST_LIBRARY);
    if library.exists() {
        shared.push(library);
    }
    Some(spawn(guest_script, &shared, &dir.join("run"), timeout, forward).expect("start the VM"))
}

/// Waits for a VM from [`start_for_test`] to power off; the run's figures go to stderr.
pub fn finish_for_test(running: Running) -> VmRun {
    let run = running.wait().expect("run the VM");
    // Straight to stderr so a normal `cargo test` run shows the figures.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "VM run: {:.1} s in all, guest booted in {:?} s; results in {}",
        run.elapsed.as_secs_f64(),
        run.boot_seconds(),
        run.results().display()
    );
    run
}
