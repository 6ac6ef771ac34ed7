//! The manifest folder (`staticPodPath`): inotify for prompt pick-up, plus a periodic relist
//! (`fileCheckFrequency`) as the safety net for missed events.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::manifest::{self, ManifestError};
use super::static_pod::{self, Origin};
use super::{SourceKind, SourceUpdate};
use gantry_vocab::spec;

/// Reads a manifest folder (or a single manifest file) into a SET of pods.
pub struct FileSource {
    path: PathBuf,
    node: String,
    /// The last pod each file produced, kept when an edit breaks the file so that a typo
    /// does not stop a running pod.
    last_good: HashMap<PathBuf, Pod>,
}

impl FileSource {
    pub fn new(path: PathBuf, node: &str) -> Self {
        let trimmed = path.to_string_lossy().trim_end_matches('/').to_string();
        let path = if trimmed.is_empty() { path } else { PathBuf::from(trimmed) };
        FileSource { path, node: node.to_string(), last_good: HashMap::new() }
    }

    /// The pods the folder defines now. Bad files are logged with their name and field and
    /// skipped; they never affect the other files' pods.
    pub fn list(&mut self) -> Vec<Pod> {
        let files = match self.files() {
            Ok(files) => files,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read static pod path; no static pods from it");
                self.last_good.clear();
                return Vec::new();
            }
        };
        self.last_good.retain(|f, _| files.contains(f));
        let mut pods = Vec::new();
        let mut names: HashMap<String, PathBuf> = HashMap::new();
        for file in files {
            let Some(pod) = self.load(&file) else { continue };
            let full_name = spec::full_name(&pod);
            if let Some(first) = names.get(&full_name) {
                tracing::error!(
                    file = %file.display(), pod = %full_name, first = %first.display(),
                    "manifest defines pod {full_name}, which {} already defines; ignoring this file", first.display()
                );
                continue;
            }
            names.insert(full_name, file);
            pods.push(pod);
        }
        pods
    }

    fn load(&mut self, file: &Path) -> Option<Pod> {
        match read_manifest(file, &self.node) {
            Ok(pod) => {
                self.last_good.insert(file.to_path_buf(), pod.clone());
                Some(pod)
            }
            Err(e) => {
                let kept = self.last_good.get(file).cloned();
                let pod_name = kept.as_ref().map(spec::full_name);
                tracing::error!(
                    file = %e.origin, field = %e.field, error = %e.reason, kept_previous = ?pod_name,
                    "invalid static pod manifest: {e}"
                );
                kept
            }
        }
    }

    /// Manifest files in name order; dotfiles and subfolders are ignored, as upstream.
    fn files(&self) -> std::io::Result<Vec<PathBuf>> {
        if std::fs::metadata(&self.path)?.is_file() {
            return Ok(vec![self.path.clone()]);
        }
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.path)? {
            let entry = entry?;
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            if !hidden && entry.file_type()?.is_file() {
                files.push(entry.path());
            }
        }
        files.sort();
        Ok(files)
    }
}

fn read_manifest(file: &Path, node: &str) -> Result<Pod, ManifestError> {
    let origin = file.to_string_lossy();
    let data = std::fs::read(file).map_err(|e| ManifestError::new(&origin, "(file)", e.to_string()))?;
    let pod = manifest::parse_pod(&data, &origin)?;
    static_pod::prepare(pod, &Origin::File(&origin), node)
}

/// Runs the source: sends a SET now, on every change inotify reports, and every `period`.
pub async fn run(path: PathBuf, node: String, period: Duration, tx: mpsc::Sender<SourceUpdate>) {
    let mut source = FileSource::new(path.clone(), &node);
    let (events_tx, mut events) = mpsc::unbounded_channel::<()>();
    let mut watcher = None;
    let mut ticker = tokio::time::interval(period);
    let mut last: Option<HashSet<String>> = None;
    loop {
        if watcher.is_none() {
            watcher = watch(&path, events_tx.clone());
        }
        let pods = source.list();
        let uids: HashSet<String> = pods.iter().map(|p| spec::uid(p).to_string()).collect();
        if last.as_ref() != Some(&uids) {
            last = Some(uids);
            if tx.send(SourceUpdate::owned(SourceKind::File, pods)).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = ticker.tick() => {}
            Some(()) = events.recv() => {
                while events.try_recv().is_ok() {} // one relist covers a burst of events
            }
        }
    }
}

fn watch(path: &Path, events: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        // Reading the manifests shows up as access events; reacting to those would relist
        // forever.
        if res.is_ok_and(|e| !e.kind.is_access()) {
            let _ = events.send(());
        }
    })
    .ok()?;
    match watcher.watch(path, RecursiveMode::NonRecursive) {
        Ok(()) => Some(watcher),
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "cannot watch static pod path yet; relisting periodically");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str =
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: NAME\nspec:\n  containers:\n  - name: c\n    image: busybox:1\n";

    fn write(dir: &Path, file: &str, name: &str) {
        std::fs::write(dir.join(file), POD.replace("NAME", name)).unwrap();
    }

    fn names(pods: &[Pod]) -> Vec<String> {
        pods.iter().map(|p| spec::name(p).to_string()).collect()
    }

    #[test]
    fn lists_manifests_skipping_dotfiles_and_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "b.yaml", "bee");
        write(dir.path(), "a.yaml", "ay");
        write(dir.path(), ".hidden.yaml", "hidden");
        std::fs::write(dir.path().join("broken.yaml"), "apiVersion: v1\nkind: Pod\nspec: 3\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut source = FileSource::new(dir.path().to_path_buf(), "n1");
        assert_eq!(names(&source.list()), ["ay-n1", "bee-n1"]);
    }

    #[test]
    fn duplicate_pod_in_a_second_file_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.yaml", "web");
        write(dir.path(), "b.yaml", "web");
        let mut source = FileSource::new(dir.path().to_path_buf(), "n1");
        let pods = source.list();
        assert_eq!(pods.len(), 1);
        assert!(pods[0].metadata.annotations.is_some());
    }

    #[test]
    fn a_broken_edit_keeps_the_previous_pod() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.yaml", "web");
        let mut source = FileSource::new(dir.path().to_path_buf(), "n1");
        let before = source.list();
        std::fs::write(dir.path().join("a.yaml"), "apiVersion: v1\nkind: Pod\nmetadata: [\n").unwrap();
        assert_eq!(source.list(), before);
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        assert!(source.list().is_empty(), "removing the file removes the pod");
    }

    #[test]
    fn missing_path_is_an_empty_set_and_single_files_work() {
        let dir = tempfile::tempdir().unwrap();
        let mut missing = FileSource::new(dir.path().join("nope"), "n1");
        assert!(missing.list().is_empty());
        write(dir.path(), "only.yaml", "solo");
        let mut single = FileSource::new(dir.path().join("only.yaml"), "n1");
        assert_eq!(names(&single.list()), ["solo-n1"]);
    }
}
