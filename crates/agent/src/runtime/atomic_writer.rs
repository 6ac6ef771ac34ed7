//! Atomic updates of a volume's files, as upstream's AtomicWriter does: the files live in a
//! hidden timestamped directory, `..data` is a symlink to it, and each top-level user path is a
//! symlink through `..data`. An update writes a new directory and swaps `..data` with one
//! rename, so readers see either the old or the new set of files, never a mix.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::projection::File;

const DATA_DIR_NAME: &str = "..data";
const NEW_DATA_DIR_NAME: &str = "..data_tmp";

static WRITER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What an update has to do, decided from the desired and the current files.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// Whether a new data directory must be written and swapped in.
    pub write: bool,
    /// Top-level user symlinks to create.
    pub add_links: Vec<String>,
    /// Top-level user entries that no longer belong to the volume.
    pub remove_links: Vec<String>,
}

/// `current` is the content behind `..data` (sorted by path), `entries` the volume directory's
/// top-level names.
pub fn plan(desired: &[File], current: &[File], entries: &[String]) -> Plan {
    let mut want: Vec<&File> = desired.iter().collect();
    want.sort();
    let mut have: Vec<&File> = current.iter().collect();
    have.sort();
    let tops: BTreeSet<&str> = desired.iter().map(|f| f.path.split('/').next().unwrap_or_default()).collect();
    let user: BTreeSet<&str> = entries.iter().map(String::as_str).filter(|e| !e.starts_with("..")).collect();
    Plan {
        write: want != have || !entries.iter().any(|e| e == DATA_DIR_NAME),
        add_links: tops.difference(&user).map(|s| s.to_string()).collect(),
        remove_links: user.difference(&tops).map(|s| s.to_string()).collect(),
    }
}

/// Makes `dir` hold exactly `files`; returns whether anything changed. `group` (an fsGroup)
/// owns the files and widens their modes as upstream does for read-only volumes.
pub fn write(dir: &Path, files: &[File], group: Option<u32>) -> std::io::Result<bool> {
    // Containers of one pod start concurrently and each sets up the pod's volumes.
    let _one_writer = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    std::fs::create_dir_all(dir)?;
    let files: Vec<File> = match group {
        Some(_) => files
            .iter()
            .map(|f| File { mode: super::projection::fs_group_mode(f.mode, false, true), ..f.clone() })
            .collect(),
        None => files.to_vec(),
    };
    let current = read_current(&dir.join(DATA_DIR_NAME))?;
    let entries: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    let plan = plan(&files, &current, &entries);
    if !plan.write && plan.add_links.is_empty() && plan.remove_links.is_empty() {
        return Ok(false);
    }
    if plan.write {
        let old = std::fs::read_link(dir.join(DATA_DIR_NAME)).ok();
        let stamp = format!("..{}.{}", jiff::Timestamp::now().strftime("%Y_%m_%d_%H_%M_%S"), fastrand::u32(..));
        let new_dir = dir.join(&stamp);
        std::fs::create_dir(&new_dir)?;
        for f in &files {
            let path = new_dir.join(&f.path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, &f.data)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode))?;
            if let Some(g) = group {
                std::os::unix::fs::chown(&path, None, Some(g))?;
            }
        }
        if let Some(g) = group {
            std::os::unix::fs::chown(&new_dir, None, Some(g))?;
        }
        let tmp = dir.join(NEW_DATA_DIR_NAME);
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&stamp, &tmp)?;
        std::fs::rename(&tmp, dir.join(DATA_DIR_NAME))?;
        if let Some(old) = old.filter(|o| o.as_os_str() != stamp.as_str()) {
            std::fs::remove_dir_all(dir.join(old))?;
        }
    }
    for name in &plan.add_links {
        std::os::unix::fs::symlink(Path::new(DATA_DIR_NAME).join(name), dir.join(name))?;
    }
    for name in &plan.remove_links {
        std::fs::remove_file(dir.join(name))?;
    }
    Ok(true)
}

/// The files behind `..data` (empty when there is none yet).
fn read_current(data: &Path) -> std::io::Result<Vec<File>> {
    let mut out = Vec::new();
    if !data.exists() {
        return Ok(out);
    }
    let mut stack = vec![data.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let path = e.path();
            if e.file_type()?.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(data).expect("walked below data").to_string_lossy().into_owned();
            let mode = e.metadata()?.permissions().mode() & 0o7777;
            out.push(File { path: rel, data: std::fs::read(&path)?, mode });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(path: &str, data: &str) -> File {
        File { path: path.into(), data: data.into(), mode: 0o644 }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn first_write_creates_data_and_links() {
        let p = plan(&[f("a", "1"), f("dir/b", "2")], &[], &[]);
        assert_eq!(p, Plan { write: true, add_links: names(&["a", "dir"]), remove_links: vec![] });
    }

    #[test]
    fn unchanged_content_needs_nothing() {
        let files = [f("a", "1")];
        let p = plan(&files, &files, &names(&["..data", "..2026_x", "a"]));
        assert_eq!(p, Plan { write: false, add_links: vec![], remove_links: vec![] });
    }

    #[test]
    fn changed_content_or_mode_rewrites_and_drops_stale_links() {
        let entries = names(&["..data", "..old", "a", "gone"]);
        let p = plan(&[f("a", "2")], &[f("a", "1"), f("gone", "x")], &entries);
        assert_eq!(p, Plan { write: true, add_links: vec![], remove_links: names(&["gone"]) });
        let mut m = f("a", "1");
        m.mode = 0o600;
        assert!(plan(&[m], &[f("a", "1")], &entries).write);
    }

    #[test]
    fn write_swaps_data_atomically() {
        let dir = std::env::temp_dir().join(format!("gantry-aw-{}", fastrand::u64(..)));
        assert!(write(&dir, &[f("a", "1"), f("sub/b", "2")], None).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).unwrap(), "2");
        assert!(!write(&dir, &[f("a", "1"), f("sub/b", "2")], None).unwrap(), "no change, no write");
        assert!(write(&dir, &[f("a", "3")], None).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "3");
        assert!(!dir.join("sub").exists());
        let hidden = std::fs::read_dir(&dir).unwrap().filter(|e| {
            let n = e.as_ref().unwrap().file_name();
            n.to_string_lossy().starts_with("..") && n != "..data"
        });
        assert_eq!(hidden.count(), 1, "the old data directory is removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
