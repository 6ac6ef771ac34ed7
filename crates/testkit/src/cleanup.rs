//! Last-resort cleanup after an instance is stopped: shims and containers that
//! outlived containerd, and mounts left below the instance directory.
//!
//! The normal path (remove every sandbox through CRI, then stop containerd)
//! leaves nothing behind; this exists so that a wedged containerd or a failed
//! removal still does not leak processes or mounts into later tests.

use std::path::Path;

/// Shim processes serving the containerd on `socket`. containerd starts
/// shims in their own process group and they outlive it, so they are found
/// by their `-address <socket>` argument.
pub(crate) fn shims_of(socket: &Path) -> Vec<i32> {
    let socket = socket.as_os_str().as_encoded_bytes();
    processes()
        .filter(|&pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            let is_shim = args.first().is_some_and(|arg0| arg0.windows(15).any(|w| w == b"containerd-shim"));
            is_shim && args.windows(2).any(|w| w[0] == b"-address" && w[1] == socket)
        })
        .collect()
}

/// Whether process `pid` exists and has `arg` among its arguments; guards
/// against killing an unrelated process that reused a recorded pid.
pub(crate) fn process_has_arg(pid: u32, arg: &std::ffi::OsStr) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    cmdline.split(|&b| b == 0).any(|a| a == arg.as_encoded_bytes())
}

/// SIGKILL each shim and, first, its direct children (the containers' init
/// processes; killing a PID namespace's init kills the whole namespace).
/// Returns once they are dead (or after a short deadline), so that their
/// mounts and cgroups can be released next.
pub(crate) fn kill_shims(socket: &Path) {
    let shims = shims_of(socket);
    if shims.is_empty() {
        return;
    }
    let mut victims = Vec::new();
    for &shim in &shims {
        victims.extend(children_of(shim));
        victims.push(shim);
    }
    for &pid in &victims {
        kill(pid);
    }
    tracing::warn!(shims = shims.len(), processes = victims.len(), "killed leftover containerd shims and containers");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while victims.iter().any(|&pid| alive(pid)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Running, as opposed to gone or a zombie waiting to be reaped by whoever
/// inherited it (a zombie holds no mounts and has left its cgroups).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat[stat.rfind(')')? + 1..].trim_start().chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

fn kill(pid: i32) {
    // SAFETY: plain syscall; a vanished pid just yields ESRCH.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

fn processes() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc").into_iter().flatten().filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
}

fn children_of(parent: i32) -> Vec<i32> {
    processes().filter(|&pid| parent_of(pid) == Some(parent)).collect()
}

/// The ppid field of /proc/PID/stat; parsed after the last ')' because the
/// command name in parentheses may itself contain spaces or parentheses.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Lazily unmount everything mounted at or below `dir`, deepest first.
pub(crate) fn unmount_below(dir: &Path) {
    let mut unmounted = 0;
    for mount_point in mounts_below(dir).into_iter().rev() {
        let Ok(path) = std::ffi::CString::new(mount_point.as_bytes()) else {
            continue;
        };
        // SAFETY: valid NUL-terminated path.
        if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
            tracing::debug!(%mount_point, "unmounted leftover mount");
            unmounted += 1;
        }
    }
    if unmounted > 0 {
        tracing::warn!(dir = %dir.display(), unmounted, "unmounted leftover mounts");
    }
}

/// Remove the (empty) cgroups runc made for the containers of a dead
/// instance: without `runc delete` they stay behind in every v1 hierarchy.
/// Container IDs are the task directories under the instance's state dir.
pub(crate) fn remove_container_cgroups(state: &Path) {
    let tasks = state.join("io.containerd.runtime.v2.task");
    let ids: std::collections::HashSet<std::ffi::OsString> = subdirs(&tasks)
        .into_iter()
        .flat_map(|namespace| subdirs(&namespace))
        .filter_map(|task| task.file_name().map(Into::into))
        .collect();
    if ids.is_empty() {
        return;
    }
    let mut removed = 0;
    for hierarchy in subdirs(Path::new("/sys/fs/cgroup")) {
        removed += remove_named_dirs(&hierarchy, &ids, CGROUP_SEARCH_DEPTH);
    }
    tracing::debug!(removed, "removed leftover container cgroups");
}

/// Remove the cgroup tree a node agent made below `root` (e.g. its QoS and pod cgroups) in
/// every v1 hierarchy, children first; cgroups still holding processes stay.
pub(crate) fn remove_cgroup_tree(root: &str) {
    fn remove_below(dir: &Path) {
        for sub in subdirs(dir) {
            remove_below(&sub);
            let _ = std::fs::remove_dir(&sub);
        }
    }
    for hierarchy in subdirs(Path::new("/sys/fs/cgroup")) {
        let dir = hierarchy.join(root.trim_start_matches('/'));
        remove_below(&dir);
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Deep enough for containerd's default `/k8s.io/<id>` and kubelet-style
/// `/kubepods/<qos>/pod<uid>/<id>` parents, shallow enough to stay cheap.
const CGROUP_SEARCH_DEPTH: usize = 5;

fn remove_named_dirs(dir: &Path, names: &std::collections::HashSet<std::ffi::OsString>, depth: usize) -> usize {
    let mut removed = 0;
    for sub in subdirs(dir) {
        let matches = sub.file_name().is_some_and(|n| names.contains(n));
        // Children first: rmdir only succeeds on a cgroup without children.
        if depth > 1 {
            removed += remove_named_dirs(&sub, names, depth - 1);
        }
        if matches && std::fs::remove_dir(&sub).is_ok() {
            removed += 1;
        }
    }
    removed
}

fn subdirs(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| entry.path())
        .collect()
}

/// Mount points at or below `dir`, in mount order (so parents come first).
fn mounts_below(dir: &Path) -> Vec<String> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let dir = dir.to_string_lossy();
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|point| point.strip_prefix(dir.as_ref()).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok().and_then(|s| u8::from_str_radix(s, 8).ok()));
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/a\040b\134c"), r"/a b\c");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }

    #[test]
    fn own_parent_is_found() {
        let me = std::process::id() as i32;
        // SAFETY: getppid has no preconditions.
        assert_eq!(parent_of(me), Some(unsafe { libc::getppid() }));
    }
}
