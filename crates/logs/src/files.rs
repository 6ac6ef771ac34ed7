//! A container's log files on disk: the current `<attempt>.log` and the rotations the log
//! manager leaves next to it, `<attempt>.log.<YYYYMMDD-hhmmss>` and, compressed,
//! `<attempt>.log.<YYYYMMDD-hhmmss>.gz` (upstream's names). `.tmp` files are a compression in
//! progress and never read.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;

pub const COMPRESS_SUFFIX: &str = ".gz";
pub const TMP_SUFFIX: &str = ".tmp";

/// The suffix of a rotation made at `now`, as upstream's `20060102-150405`.
pub fn rotation_stamp(now: Timestamp) -> String {
    now.strftime("%Y%m%d-%H%M%S").to_string()
}

/// One rotated file of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    pub name: String,
    pub compressed: bool,
}

/// The rotations of `base` among `names`, oldest first (the stamps sort as text).
pub fn rotations<I: IntoIterator<Item = String>>(base: &str, names: I) -> Vec<Rotated> {
    let prefix = format!("{base}.");
    let mut found: Vec<(String, Rotated)> = names
        .into_iter()
        .filter_map(|name| {
            let rest = name.strip_prefix(&prefix)?;
            if rest.ends_with(TMP_SUFFIX) {
                return None;
            }
            let (stamp, compressed) = match rest.strip_suffix(COMPRESS_SUFFIX) {
                Some(stamp) => (stamp, true),
                None => (rest, false),
            };
            let valid = stamp.len() == 15
                && stamp.bytes().enumerate().all(|(i, b)| if i == 8 { b == b'-' } else { b.is_ascii_digit() });
            valid.then(|| (stamp.to_string(), Rotated { name: name.clone(), compressed }))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.compressed.cmp(&a.1.compressed)));
    found.into_iter().map(|(_, r)| r).collect()
}

/// Every file of the log at `path` in the order it was written: rotations, then the current
/// file if it exists.
pub fn all_files(path: &Path) -> io::Result<Vec<PathBuf>> {
    let (dir, base) = split(path)?;
    let names = match std::fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let mut files: Vec<PathBuf> = rotations(base, names).into_iter().map(|r| dir.join(r.name)).collect();
    if path.exists() {
        files.push(path.to_path_buf());
    }
    Ok(files)
}

pub fn split(path: &Path) -> io::Result<(&Path, &str)> {
    let dir = path.parent().ok_or_else(|| io::Error::other(format!("{}: no directory", path.display())))?;
    let base = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::other(format!("{}: no file name", path.display())))?;
    Ok((dir, base))
}

/// Opens a log file for reading, decompressing rotations that were gzipped.
pub fn open(path: &Path) -> io::Result<Box<dyn BufRead + Send>> {
    let file = File::open(path)?;
    if path.extension().is_some_and(|e| e == "gz") {
        Ok(Box::new(BufReader::new(flate2::read::GzDecoder::new(file))))
    } else {
        Ok(Box::new(BufReader::new(file)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotations_sort_oldest_first_and_skip_foreign_names() {
        let names = [
            "0.log",
            "0.log.20240102-000000",
            "0.log.20240101-000000.gz",
            "0.log.20240101-120000.gz.tmp",
            "0.log.garbage",
            "1.log.20230101-000000",
        ]
        .map(String::from);
        let r = rotations("0.log", names);
        assert_eq!(
            r,
            [
                Rotated { name: "0.log.20240101-000000.gz".into(), compressed: true },
                Rotated { name: "0.log.20240102-000000".into(), compressed: false },
            ]
        );
        assert_eq!(rotation_stamp("2024-03-04T05:06:07.8Z".parse().unwrap()), "20240304-050607");
    }

    #[test]
    fn reads_compressed_rotations_in_order() {
        use std::io::{Read, Write};
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        std::fs::write(&log, "current\n").unwrap();
        std::fs::write(dir.path().join("0.log.20240102-000000"), "middle\n").unwrap();
        let gz = File::create(dir.path().join("0.log.20240101-000000.gz")).unwrap();
        let mut enc = flate2::write::GzEncoder::new(gz, flate2::Compression::default());
        enc.write_all(b"oldest\n").unwrap();
        enc.finish().unwrap();
        let mut text = String::new();
        for f in all_files(&log).unwrap() {
            open(&f).unwrap().read_to_string(&mut text).unwrap();
        }
        assert_eq!(text, "oldest\nmiddle\ncurrent\n");
    }
}
