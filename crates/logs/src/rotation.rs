//! Container log rotation, as upstream's container log manager does it: every
//! `containerLogMonitorInterval`, each running container whose log reached
//! `containerLogMaxSize` gets its older rotations cleaned up (left-over `.tmp` files, the
//! uncompressed twin of a `.gz`, the oldest beyond `containerLogMaxFiles`), all but the newest
//! rotation compressed, and the current file renamed to `<log>.<YYYYMMDD-hhmmss>` before CRI
//! `ReopenContainerLog` makes the runtime start a new one. `plan` is the pure part.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use gantry_cri::{RuntimeClient, api};
use k8s_openapi::jiff::Timestamp;

use super::files::{self, COMPRESS_SUFFIX, TMP_SUFFIX};
use gantry_config::LogSettings;
use gantry_vocab::cri_labels as labels;

/// What to do with one log's files before rotating it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// File names to delete.
    pub remove: Vec<String>,
    /// Rotations to gzip (into `<name>.gz`, through `<name>.gz.tmp`).
    pub compress: Vec<String>,
}

/// The clean-up before a rotation of `base`, given the names in its directory. After it and
/// the rotation, at most `max_files` files remain: the new current file, the rotation just
/// made, and `max_files - 2` older ones.
pub fn plan(base: &str, names: &[String], max_files: u32) -> Plan {
    let mut plan = Plan::default();
    let prefix = format!("{base}.");
    let present: HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut kept = Vec::new();
    for r in files::rotations(base, names.iter().cloned()) {
        // A crash between compressing and removing the original leaves both.
        if !r.compressed && present.contains(format!("{}{COMPRESS_SUFFIX}", r.name).as_str()) {
            plan.remove.push(r.name);
        } else {
            kept.push(r);
        }
    }
    plan.remove.extend(names.iter().filter(|n| n.starts_with(&prefix) && n.ends_with(TMP_SUFFIX)).cloned());
    let max_rotated = max_files.saturating_sub(2) as usize;
    let excess = kept.len().saturating_sub(max_rotated);
    plan.remove.extend(kept.drain(..excess).map(|r| r.name));
    // The newest rotation stays as it is: a log reader may still be draining it.
    if let Some((_newest, older)) = kept.split_last() {
        plan.compress.extend(older.iter().filter(|r| !r.compressed).map(|r| r.name.clone()));
    }
    plan
}

/// Runs forever: checks the running containers' logs every monitor interval.
pub async fn run(runtime: RuntimeClient, node: String, settings: LogSettings) {
    let runtime = Arc::new(runtime);
    let mut tick = tokio::time::interval(settings.monitor_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut paths = HashMap::new();
    loop {
        tick.tick().await;
        if let Err(e) = rotate_all(&runtime, &node, &settings, &mut paths).await {
            tracing::warn!(error = %e, "container log rotation: cannot list containers");
        }
    }
}

/// A running container's log, by container ID: its path, and its name and pod for the logs.
struct Log {
    path: PathBuf,
    container: String,
    pod: String,
}

/// One pass: the log of each running container that reached the maximum size is rotated.
/// A container's log path never changes, so the runtime is asked for it once per container
/// (`paths` keeps it across passes), and one blocking task measures all the logs: at density
/// a pass costs one `ListContainers`, not one `ContainerStatus` and one thread hand-off per
/// container.
async fn rotate_all(
    runtime: &Arc<RuntimeClient>,
    node: &str,
    settings: &LogSettings,
    paths: &mut HashMap<String, Log>,
) -> Result<(), gantry_cri::CriError> {
    let filter = api::ContainerFilter {
        state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
        label_selector: labels::owned_by(node),
        ..Default::default()
    };
    let containers = runtime.list_containers(api::ListContainersRequest { filter: Some(filter) }).await?.containers;
    let running: HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
    paths.retain(|id, _| running.contains(id.as_str()));
    let workers = settings.max_workers.max(1) as usize;
    let new: Vec<(String, String, String)> = containers
        .iter()
        .filter(|c| !paths.contains_key(&c.id))
        .map(|c| {
            let label = |key: &str| c.labels.get(key).cloned().unwrap_or_default();
            (c.id.clone(), label(labels::CONTAINER_NAME), label(labels::POD_NAME))
        })
        .collect();
    let found: Vec<(String, Option<Log>)> = futures::stream::iter(new)
        .map(|(id, container, pod)| async move {
            let path = match log_path(runtime, &id).await {
                Ok(path) => path,
                Err(e) => {
                    tracing::warn!(container = %container, pod = %pod, container_id = %id, error = %e, "failed to rotate container log");
                    None
                }
            };
            (id, path.map(|path| Log { path, container, pod }))
        })
        .buffer_unordered(workers)
        .collect()
        .await;
    paths.extend(found.into_iter().filter_map(|(id, log)| Some((id, log?))));
    let logs: Vec<(String, PathBuf)> = paths.iter().map(|(id, log)| (id.clone(), log.path.clone())).collect();
    let sizes = tokio::task::spawn_blocking(move || {
        logs.into_iter().map(|(id, path)| (id, std::fs::metadata(&path).map(|m| m.len()))).collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    // The logs to rotate, and those that could not be measured (with why).
    let due: Vec<(&Log, String, Option<io::Error>)> = sizes
        .into_iter()
        .filter_map(|(id, size)| {
            let log = paths.get(&id)?;
            match size {
                Ok(size) => (size >= settings.max_size).then_some((log, id, None)),
                // Not created yet, or renamed and being reopened.
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => Some((log, id, Some(e))),
            }
        })
        .collect();
    futures::stream::iter(due)
        .for_each_concurrent(workers, |(log, id, failed)| async move {
            let result = match failed {
                None => rotate_one(runtime, &id, &log.path, settings).await,
                Some(e) => Err(io_err(&log.path)(e)),
            };
            if let Err(e) = result {
                tracing::warn!(container = %log.container, pod = %log.pod, container_id = %id, error = %e, "failed to rotate container log");
            }
        })
        .await;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
enum RotateError {
    #[error(transparent)]
    Cri(#[from] gantry_cri::CriError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RotateError + '_ {
    move |source| RotateError::Io { path: path.to_path_buf(), source }
}

/// The container's log file, as the runtime reports it (None: it has none).
async fn log_path(runtime: &RuntimeClient, id: &str) -> Result<Option<PathBuf>, gantry_cri::CriError> {
    let status =
        runtime.container_status(api::ContainerStatusRequest { container_id: id.into(), verbose: false }).await?;
    Ok(status.status.map(|s| PathBuf::from(s.log_path)).filter(|p| !p.as_os_str().is_empty()))
}

/// Cleans up `path`'s older rotations and rotates it.
async fn rotate_one(runtime: &RuntimeClient, id: &str, path: &Path, settings: &LogSettings) -> Result<(), RotateError> {
    let max_files = settings.max_files;
    let clean_path = path.to_path_buf();
    tokio::task::spawn_blocking(move || clean_up(&clean_path, max_files))
        .await
        .map_err(|e| RotateError::Io { path: path.to_path_buf(), source: io::Error::other(e) })??;
    rotate_latest(runtime, id, path).await
}

/// Applies the plan: removals, then compression (blocking I/O).
fn clean_up(path: &Path, max_files: u32) -> Result<(), RotateError> {
    let (dir, base) = files::split(path).map_err(io_err(path))?;
    let names: Vec<String> =
        std::fs::read_dir(dir).map_err(io_err(dir))?.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    let plan = plan(base, &names, max_files);
    for name in &plan.remove {
        let p = dir.join(name);
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&p)(e)),
            _ => {}
        }
    }
    for name in &plan.compress {
        compress(&dir.join(name))?;
    }
    Ok(())
}

/// Gzips `path` into `path.gz` through a `.tmp` file, then removes `path`.
fn compress(path: &Path) -> Result<(), RotateError> {
    let gz = PathBuf::from(format!("{}{COMPRESS_SUFFIX}", path.display()));
    let tmp = PathBuf::from(format!("{}{TMP_SUFFIX}", gz.display()));
    let mut input = std::fs::File::open(path).map_err(io_err(path))?;
    let out = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
    let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    io::copy(&mut input, &mut enc).map_err(io_err(&tmp))?;
    enc.finish().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, &gz).map_err(io_err(&gz))?;
    std::fs::remove_file(path).map_err(io_err(path))
}

/// Renames the current file and makes the runtime reopen its log; renames it back when the
/// runtime cannot, so the container keeps one log file.
async fn rotate_latest(runtime: &RuntimeClient, id: &str, path: &Path) -> Result<(), RotateError> {
    let rotated = PathBuf::from(format!("{}.{}", path.display(), files::rotation_stamp(Timestamp::now())));
    tokio::fs::rename(path, &rotated).await.map_err(io_err(path))?;
    if let Err(e) = runtime.reopen_container_log(api::ReopenContainerLogRequest { container_id: id.into() }).await {
        if let Err(back) = tokio::fs::rename(&rotated, path).await {
            tracing::error!(file = %rotated.display(), error = %back, "cannot rename the rotated log back");
        }
        return Err(e.into());
    }
    tracing::debug!(container_id = id, file = %rotated.display(), "rotated container log");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn keeps_max_files_minus_two_rotations_and_compresses_all_but_the_newest() {
        let n = names(&[
            "0.log",
            "0.log.20240101-000000.gz",
            "0.log.20240102-000000.gz",
            "0.log.20240103-000000",
            "0.log.20240104-000000",
        ]);
        let p = plan("0.log", &n, 4);
        assert_eq!(p.remove, ["0.log.20240101-000000.gz", "0.log.20240102-000000.gz"]);
        assert_eq!(p.compress, ["0.log.20240103-000000"]);
        // Default of 5: three older rotations stay.
        let p = plan("0.log", &n, 5);
        assert_eq!(p.remove, ["0.log.20240101-000000.gz"]);
        // maxFiles 2: only the current file and the rotation about to be made remain.
        let p = plan("0.log", &n, 2);
        assert_eq!(p.remove.len(), 4);
        assert!(p.compress.is_empty());
    }

    #[test]
    fn removes_leftovers_of_an_interrupted_compression() {
        let n = names(&[
            "0.log",
            "0.log.20240101-000000",
            "0.log.20240101-000000.gz",
            "0.log.20240102-000000.gz.tmp",
            "1.log.x.tmp",
        ]);
        let p = plan("0.log", &n, 5);
        assert_eq!(p.remove, ["0.log.20240101-000000", "0.log.20240102-000000.gz.tmp"]);
        assert!(p.compress.is_empty());
    }

    #[test]
    fn clean_up_compresses_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        for (name, text) in [("0.log", "c\n"), ("0.log.20240101-000000", "a\n"), ("0.log.20240102-000000", "b\n")] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        clean_up(&log, 5).unwrap();
        let mut left: Vec<_> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["0.log", "0.log.20240101-000000.gz", "0.log.20240102-000000"]);
        let mut text = String::new();
        for f in files::all_files(&log).unwrap() {
            std::io::Read::read_to_string(&mut files::open(&f).unwrap(), &mut text).unwrap();
        }
        assert_eq!(text, "a\nb\nc\n");
    }
}
