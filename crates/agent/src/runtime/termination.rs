//! Termination messages: a host file per container instance, bind-mounted at
//! `terminationMessagePath`, whose content (at most 4096 bytes) becomes
//! `state.terminated.message`; with `FallbackToLogsOnError`, a failed container that wrote
//! nothing reports the tail of its log instead (80 lines, 2048 bytes), as upstream.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use gantry_cri::api;
use k8s_openapi::api::core::v1::Container;

use gantry_vocab::cri_labels as labels;

pub const DEFAULT_PATH: &str = "/dev/termination-log";
pub const MAX_MESSAGE_BYTES: u64 = 4096;
pub const MAX_LOG_LINES: usize = 80;
pub const MAX_LOG_BYTES: usize = 2048;
/// How much of the end of a log file is read to find its last lines.
const LOG_WINDOW: u64 = 64 * 1024;

/// The container's `terminationMessagePath` (API default when unset); empty means none.
pub fn container_path(c: &Container) -> &str {
    c.termination_message_path.as_deref().unwrap_or(DEFAULT_PATH)
}

pub fn policy(c: &Container) -> &str {
    c.termination_message_policy.as_deref().unwrap_or("File")
}

/// Where the host side of the message file of one container instance lives.
pub fn host_file(pod_dir: &Path, container: &str, attempt: u32) -> PathBuf {
    pod_dir.join("containers").join(container).join(attempt.to_string())
}

/// Creates (or empties) the host file, writable by any user the container runs as.
pub fn create(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new("/")))?;
    std::fs::write(path, b"")?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
}

/// The message of an exited container, from its status (annotations, mounts, log path).
pub fn read(status: &api::ContainerStatus) -> String {
    let Some(path) = status.annotations.get(labels::TERMINATION_MESSAGE_PATH).filter(|p| !p.is_empty()) else {
        return String::new();
    };
    let fallback = status.annotations.get(labels::TERMINATION_MESSAGE_POLICY).map(String::as_str)
        == Some("FallbackToLogsOnError")
        && status.exit_code != 0
        && status.reason != "ContainerCannotRun";
    let written = status
        .mounts
        .iter()
        .find(|m| m.container_path == *path)
        .and_then(|m| read_tail(Path::new(&m.host_path), MAX_MESSAGE_BYTES).ok())
        .unwrap_or_default();
    if !written.is_empty() || !fallback {
        return String::from_utf8_lossy(&written).into_owned();
    }
    read_tail(Path::new(&status.log_path), LOG_WINDOW)
        .map(|log| log_tail(&String::from_utf8_lossy(&log)))
        .unwrap_or_default()
}

/// The last `max` bytes of a file.
fn read_tail(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(max)))?;
    let mut data = Vec::new();
    f.take(max).read_to_end(&mut data)?;
    Ok(data)
}

/// The content of the last [`MAX_LOG_LINES`] entries of a CRI log (`<time> <stream> <P|F>
/// <content>`), cut to its last [`MAX_LOG_BYTES`] bytes.
pub fn log_tail(log: &str) -> String {
    let entries: Vec<&str> = log.lines().filter(|l| !l.is_empty()).collect();
    let mut out = String::new();
    for line in &entries[entries.len().saturating_sub(MAX_LOG_LINES)..] {
        let mut parts = line.splitn(4, ' ');
        let (_time, _stream, tag, content) = (parts.next(), parts.next(), parts.next(), parts.next().unwrap_or(""));
        out.push_str(content);
        if tag != Some("P") {
            out.push('\n');
        }
    }
    let mut start = out.len().saturating_sub(MAX_LOG_BYTES);
    while !out.is_char_boundary(start) {
        start += 1;
    }
    out[start..].to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn status(dir: &Path, policy: &str, exit_code: i32) -> api::ContainerStatus {
        api::ContainerStatus {
            exit_code,
            annotations: HashMap::from([
                (labels::TERMINATION_MESSAGE_PATH.to_string(), "/dev/termination-log".to_string()),
                (labels::TERMINATION_MESSAGE_POLICY.to_string(), policy.to_string()),
            ]),
            mounts: vec![api::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: dir.join("msg").to_string_lossy().into_owned(),
                ..Default::default()
            }],
            log_path: dir.join("0.log").to_string_lossy().into_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn message_is_the_last_4096_bytes_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = "x".repeat(5000);
        text.push_str("end");
        std::fs::write(dir.path().join("msg"), &text).unwrap();
        let m = read(&status(dir.path(), "File", 1));
        assert_eq!(m.len(), 4096);
        assert!(m.ends_with("xend"));
    }

    #[test]
    fn falls_back_to_the_log_only_on_error_with_an_empty_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("msg"), "").unwrap();
        std::fs::write(dir.path().join("0.log"), "2024-01-01T00:00:00Z stderr F boom\n").unwrap();
        assert_eq!(read(&status(dir.path(), "FallbackToLogsOnError", 1)), "boom\n");
        assert_eq!(read(&status(dir.path(), "FallbackToLogsOnError", 0)), "", "success does not fall back");
        assert_eq!(read(&status(dir.path(), "File", 1)), "");
        std::fs::write(dir.path().join("msg"), "written").unwrap();
        assert_eq!(read(&status(dir.path(), "FallbackToLogsOnError", 1)), "written");
    }

    #[test]
    fn log_tail_keeps_80_lines_and_2048_bytes() {
        let log: String = (0..100).map(|i| format!("t stdout F line{i}\n")).collect();
        let tail = log_tail(&log);
        assert!(tail.starts_with("line20\n") && tail.ends_with("line99\n"), "{tail}");
        let long: String = (0..80).map(|i| format!("t stdout F {i:0>40}\n")).collect();
        assert_eq!(log_tail(&long).len(), 2048);
        assert_eq!(log_tail("t stdout P par\nt stdout F tial\n"), "partial\n");
    }
}
