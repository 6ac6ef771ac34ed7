//! The Debian package on a real systemd host: `scripts/package` builds it from the test build of
//! Gantry, and the guest script `vm/package.sh` installs it over stand-ins for the Go kubelet's
//! `kubelet` and `kubeadm` packages, runs it as `kubelet.service` from a kubeadm-shaped file
//! layout, restarts it, and removes and purges it again. The tests here assert on what it saw.
//!
//! Needs root and the VM image (`scripts/vm build`, which `scripts/test` runs); otherwise the
//! tests print SKIPPED, and fail under `CI=true`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use gantry_testkit::vm::{self, VmRun};

/// The longest the whole boot may take (TCG emulation on a loaded machine is slow).
const VM_TIMEOUT: Duration = Duration::from_secs(900);

fn vm() -> Option<&'static VmRun> {
    static RUN: OnceLock<Option<VmRun>> = OnceLock::new();
    RUN.get_or_init(|| {
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm");
        vm::boot_for_test("vm_package", &here.join("package.sh"), |dir| vec![package(dir)], VM_TIMEOUT)
    })
    .as_ref()
}

/// `scripts/package` run on the binary under test; the `.deb` it wrote.
fn package(dir: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/package");
    let out = Command::new(script)
        .env("GANTRY_BIN", env!("CARGO_BIN_EXE_gantry"))
        .env("PACKAGE_OUT", dir.join("package"))
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/package failed: {}", String::from_utf8_lossy(&out.stderr));
    let deb = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(deb.is_file(), "scripts/package named {deb:?}, which is not a file");
    deb
}

fn completed() -> Option<&'static VmRun> {
    let run = vm()?;
    assert_eq!(run.exit, 0, "the guest script failed\n{}", run.report());
    Some(run)
}

/// The guest's `layout` record: where `kubelet` leads, whose unit and drop-in are in place, the
/// diversions, and whether each of the node's files is still there.
struct Layout(String);

impl Layout {
    fn read(run: &VmRun, name: &str) -> Layout {
        Layout(run.read(name))
    }

    /// The rest of the first `key …` line.
    fn get(&self, key: &str) -> &str {
        self.0.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')).unwrap_or_default().trim()
    }

    fn assert_node_files_kept(&self, when: &str) {
        for file in [
            "/var/lib/kubelet/config.yaml",
            "/var/lib/kubelet/kubeadm-flags.env",
            "/etc/default/kubelet",
            "/etc/kubernetes/manifests/web.yaml",
        ] {
            assert!(self.0.contains(&format!("node-file {file} kept\n")), "{file} not kept {when}:\n{}", self.0);
        }
    }
}

#[test]
fn install_over_the_go_kubelet_diverts_its_files_and_makes_gantry_the_kubelet() {
    let Some(run) = completed() else { return };
    assert_eq!(run.read("install/dpkg-exit").trim(), "0", "{}", run.read("install/dpkg.log"));
    let layout = Layout::read(run, "install/layout");
    assert_eq!(layout.get("kubelet-path"), "/usr/bin/gantry", "{}", layout.0);
    assert_eq!(layout.get("kubectl-maintenance-path"), "/usr/bin/gantry", "{}", layout.0);
    assert!(layout.get("unit").contains("Gantry"), "the packaged unit is not in place: {}", layout.0);
    assert!(layout.get("dropin").contains("kubeadm expects"), "the packaged drop-in is not in place: {}", layout.0);
    assert_eq!(layout.get("diversions"), "3", "{}", layout.0);
    assert!(
        run.read("install/kubelet-version").starts_with("Kubernetes v1."),
        "{}",
        run.read("install/kubelet-version")
    );
    assert!(
        run.read("install/maintenance-help").contains("kubectl maintenance"),
        "{}",
        run.read("install/maintenance-help")
    );
}

#[test]
fn the_service_runs_gantry_with_the_flags_of_the_kubeadm_files() {
    let Some(run) = completed() else { return };
    let before = run.read("install/before");
    assert!(before.contains("exe=/usr/bin/sleep"), "the Go kubelet stand-in was not running first: {before}");
    let service = run.read("install/service");
    assert!(service.contains("active=active"), "{service}");
    assert!(service.contains("exe=/usr/bin/gantry"), "the running service is not Gantry: {service}");
    // One flag from each file the drop-in reads: its own, kubeadm-flags.env, /etc/default/kubelet.
    for flag in [
        "--config=/var/lib/kubelet/config.yaml",
        "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
        "--hostname-override=pkg-node",
    ] {
        assert!(service.contains(flag), "{flag} missing from the service's command line: {service}");
    }
}

#[test]
fn journalctl_shows_gantrys_logs_and_the_static_pod_runs() {
    let Some(run) = completed() else { return };
    let journal = run.read("install/journal");
    assert!(journal.contains("starting gantry kubelet: nodeName=pkg-node"), "{journal}");
    assert!(journal.contains("Started container main pod=default/web-pkg-node"), "{journal}");
    assert!(!run.read("install/containers").trim().is_empty(), "no running containers\n{journal}");
}

#[test]
fn a_service_restart_leaves_the_pods_containers_running() {
    let Some(run) = completed() else { return };
    let journal = run.read("install/journal");
    assert_eq!(journal.matches("starting gantry kubelet").count(), 2, "{journal}");
    assert_eq!(
        journal.matches("Started container main").count(),
        1,
        "the restart started the container again\n{journal}"
    );
    assert_eq!(run.read("install/containers-after-restart"), run.read("install/containers"));
}

#[test]
fn removal_gives_the_go_kubelet_back_and_keeps_the_nodes_files_and_pods() {
    let Some(run) = completed() else { return };
    assert_eq!(run.read("remove/dpkg-exit").trim(), "0", "{}", run.read("remove/dpkg.log"));
    for record in ["remove/layout", "remove/layout-purged"] {
        let layout = Layout::read(run, record);
        assert_eq!(layout.get("kubelet-path"), "go-stand-in", "{record}:\n{}", layout.0);
        assert_eq!(layout.get("kubectl-maintenance-path"), "absent", "{record}:\n{}", layout.0);
        assert_eq!(layout.get("unit"), "# go-kubelet unit", "{record}:\n{}", layout.0);
        assert_eq!(layout.get("dropin"), "# go-kubeadm drop-in", "{record}:\n{}", layout.0);
        assert_eq!(layout.get("diversions"), "0", "{record}:\n{}", layout.0);
        layout.assert_node_files_kept(record);
    }
    let service = run.read("remove/service");
    assert!(
        service.contains("active=active") && service.contains("exe=/usr/bin/sleep"),
        "the Go kubelet did not take over: {service}"
    );
    assert_eq!(run.read("remove/containers"), run.read("install/containers"), "removal touched the pods");
}

#[test]
fn on_a_node_without_the_go_kubelet_install_and_removal_leave_nothing_behind_but_the_nodes_files() {
    let Some(run) = completed() else { return };
    assert_eq!(run.read("fresh/dpkg-exit").trim(), "0", "{}", run.read("fresh/dpkg.log"));
    let installed = Layout::read(run, "fresh/layout");
    assert_eq!(installed.get("kubelet-path"), "/usr/bin/gantry", "{}", installed.0);
    assert_eq!(installed.get("diversions"), "3", "{}", installed.0);
    assert!(run.read("fresh/service").contains("exe=/usr/bin/gantry"), "{}", run.read("fresh/service"));
    assert_eq!(run.read("fresh/remove-exit").trim(), "0", "{}", run.read("fresh/dpkg.log"));
    let removed = Layout::read(run, "fresh/layout-removed");
    assert_eq!(removed.get("kubelet-path"), "absent", "{}", removed.0);
    assert_eq!(removed.get("diversions"), "0", "{}", removed.0);
    removed.assert_node_files_kept("after removal on a fresh node");
    assert_eq!(run.read("fresh/service-removed").trim(), "active=inactive", "the service outlived the package");
}
