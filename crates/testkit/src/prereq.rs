//! Deciding whether end-to-end tests can run here, and skipping loudly if not.

use std::path::Path;

use crate::cmd;

/// Programs the harness starts. containerd finds runc and the shim through
/// `$PATH`, which [`tool_path`] makes sure includes the sbin directories.
const TOOLS: [&str; 6] = ["containerd", "containerd-shim-runc-v2", "ctr", "runc", "ip", "gcc"];

/// `$PATH` plus the standard system directories: `cargo test` often runs with a
/// user's PATH that lacks /usr/sbin, where Debian installs runc and ip.
pub fn tool_path() -> std::ffi::OsString {
    let mut dirs: Vec<_> = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    for system in ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        if !dirs.iter().any(|d| d == Path::new(system)) {
            dirs.push(system.into());
        }
    }
    std::env::join_paths(dirs).expect("PATH entries contain no separator")
}

/// Why end-to-end tests cannot run on this machine, or `None` if they can.
pub fn missing_prerequisite() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    // Make on_path() see the same PATH the children will get.
    let path = tool_path();
    let missing: Vec<&str> = TOOLS.into_iter().filter(|tool| !cmd::on_path_in(tool, &path)).collect();
    if !missing.is_empty() {
        return Some(format!("missing programs: {}", missing.join(", ")));
    }
    if !Path::new("/bin/busybox").is_file() {
        return Some("missing /bin/busybox (install busybox-static)".into());
    }
    let cni = crate::cni::cni_bin_dir();
    let missing_cni: Vec<&str> =
        crate::cni::REQUIRED_PLUGINS.into_iter().filter(|plugin| !cni.join(plugin).is_file()).collect();
    if !missing_cni.is_empty() {
        return Some(format!("missing CNI plugins in {}: {}", cni.display(), missing_cni.join(", ")));
    }
    None
}

/// Report a skip on stderr; under CI (env `CI` set and not "false"/"0") the
/// tests must run, so a missing prerequisite is a failure there.
pub fn skip_or_panic(reason: &str) {
    let message = format!("SKIPPED {reason}: end-to-end tests need root and containerd; run scripts/test as root");
    if running_in_ci() {
        panic!("CI must run the end-to-end tests, but {message}");
    }
    // Straight to the stderr handle, not eprintln!: the test harness captures
    // the latter, and a skip must be visible in a normal `cargo test` run.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{message}");
}

fn running_in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}
