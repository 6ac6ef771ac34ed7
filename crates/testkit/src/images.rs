//! Tiny OCI images built locally, because no registry is reachable from tests.
//!
//! Each image is written as an OCI image-layout tarball (`oci-layout`, `index.json`,
//! `blobs/sha256/*`) with a single uncompressed layer. Everything that goes into
//! the tarballs is deterministic (fixed mtimes, uid/gid 0, sorted JSON keys), so
//! the same inputs always give the same image ID.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::cmd;
use crate::error::{IoContext, Result};

/// Image holding our own pause binary; the CRI sandbox image.
pub const PAUSE_IMAGE: &str = "gantry.local/pause:v1";
/// Image holding Debian's static busybox with all its applets linked.
pub const BUSYBOX_IMAGE: &str = "gantry.local/busybox:v1";

/// Bump when the layout format changes so stale cached tarballs are not reused.
const FORMAT_VERSION: &str = "1";
const PAUSE_SOURCE: &str = include_str!("../assets/pause.c");
const BUSYBOX_BINARY: &str = "/bin/busybox";
const IMAGE_PATH_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
/// The epoch is as good as any fixed time and says "synthetic" to a reader.
const FIXED_TIME: &str = "1970-01-01T00:00:00Z";

const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// The images the test harness provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestImage {
    Pause,
    Busybox,
}

impl TestImage {
    pub const ALL: [TestImage; 2] = [TestImage::Pause, TestImage::Busybox];

    /// Full reference the image is imported under.
    pub fn reference(self) -> &'static str {
        match self {
            TestImage::Pause => PAUSE_IMAGE,
            TestImage::Busybox => BUSYBOX_IMAGE,
        }
    }

    fn short_name(self) -> &'static str {
        match self {
            TestImage::Pause => "pause",
            TestImage::Busybox => "busybox",
        }
    }

    /// Hash of everything the image is made from, so a changed pause.c or an
    /// upgraded busybox package gives a new cache file instead of a stale one.
    fn cache_key(self) -> Result<String> {
        let mut hasher = Sha256::new();
        hasher.update(FORMAT_VERSION);
        hasher.update(go_arch());
        match self {
            TestImage::Pause => hasher.update(PAUSE_SOURCE),
            TestImage::Busybox => hasher.update(file_identity(Path::new(BUSYBOX_BINARY))?),
        }
        Ok(hex::encode(&hasher.finalize()[..8]))
    }

    fn recipe(self) -> Result<Recipe> {
        match self {
            TestImage::Pause => pause_recipe(),
            TestImage::Busybox => busybox_recipe(),
        }
    }
}

/// Size, mtime and inode of a file: changes whenever a package upgrade
/// replaces it, and far cheaper than hashing the content on every start
/// (sha2 in an unoptimised test build takes ~100 ms for busybox).
fn file_identity(path: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ctx(|| format!("stat {}", path.display()))?;
    Ok(format!("{}:{}.{}:{}", meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ino()))
}

/// An image layout tarball on disk, ready for `ctr images import`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    pub image: TestImage,
    pub path: PathBuf,
}

/// Where built tarballs are cached: `$GANTRY_IMAGE_CACHE`, else
/// `<cargo target dir>/gantry-images`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("GANTRY_IMAGE_CACHE") {
        return PathBuf::from(dir);
    }
    target_dir().join("gantry-images")
}

/// The cargo target dir, found from the running executable (tests live in
/// `target/<profile>/deps`, binaries in `target/<profile>`); cargo marks the
/// target root with `CACHEDIR.TAG`.
fn target_dir() -> PathBuf {
    let from_exe = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().find(|dir| dir.join("CACHEDIR.TAG").is_file()).map(Path::to_path_buf));
    from_exe.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// Serialises builds inside one process; across processes the atomic rename
/// in [`ensure_image`] is what keeps readers from seeing half-written files.
static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// Build every test image into `cache_dir` unless already cached.
pub fn ensure_images(cache_dir: &Path) -> Result<Vec<BuiltImage>> {
    TestImage::ALL.iter().map(|&image| ensure_image(image, cache_dir)).collect()
}

/// Build one image into `cache_dir` unless a tarball for the same inputs exists.
pub fn ensure_image(image: TestImage, cache_dir: &Path) -> Result<BuiltImage> {
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let path = cache_dir.join(format!("{}-{}.oci.tar", image.short_name(), image.cache_key()?));
    if path.is_file() {
        tracing::debug!(image = image.reference(), path = %path.display(), "image cached");
        return Ok(BuiltImage { image, path });
    }
    std::fs::create_dir_all(cache_dir).ctx(|| format!("create {}", cache_dir.display()))?;
    let started = std::time::Instant::now();
    let bytes = build_layout(image.reference(), &image.recipe()?)?;
    // Write beside the destination and rename: concurrent builders each produce
    // identical content, and a reader sees either nothing or a complete file.
    let mut tmp =
        tempfile::NamedTempFile::new_in(cache_dir).ctx(|| format!("create temp file in {}", cache_dir.display()))?;
    tmp.write_all(&bytes).ctx(|| "write image tarball".into())?;
    // NamedTempFile creates 0600; the cache may be shared with other users' tools.
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .ctx(|| "chmod image tarball".into())?;
    tmp.persist(&path).map_err(|e| e.error).ctx(|| format!("rename image tarball to {}", path.display()))?;
    tracing::info!(
        image = image.reference(),
        path = %path.display(),
        bytes = bytes.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "built image"
    );
    Ok(BuiltImage { image, path })
}

/// Writes a tiny throwaway image named `reference` (its content differs by `marker`, so each
/// gets its own image ID) as a layout tarball into `dir`, for garbage collection tests.
pub fn build_scratch_image(reference: &str, marker: &str, dir: &Path) -> Result<PathBuf> {
    let mut entries = base_dirs();
    entries.push(Entry::File { path: "marker".into(), mode: 0o644, data: marker.as_bytes().to_vec() });
    let recipe = Recipe { entries, entrypoint: vec![], cmd: vec!["/marker".into()] };
    let path = dir.join(format!("scratch-{marker}.oci.tar"));
    std::fs::write(&path, build_layout(reference, &recipe)?).ctx(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// Architecture in Go/OCI naming, as containerd matches platforms with it.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// One entry of the single image layer. Parents must come before children.
#[derive(Debug, Clone)]
enum Entry {
    Dir { path: String, mode: u32 },
    File { path: String, mode: u32, data: Vec<u8> },
    Symlink { path: String, target: String },
}

/// What an image is made of: its filesystem and its runtime config.
#[derive(Debug, Clone)]
struct Recipe {
    entries: Vec<Entry>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
}

/// Directories every image gets; runc can create mount points itself, but
/// having them lets containers run with a read-only root filesystem.
fn base_dirs() -> Vec<Entry> {
    [("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("proc", 0o555), ("root", 0o700), ("sys", 0o555), ("tmp", 0o1777)]
        .into_iter()
        .map(|(path, mode)| Entry::Dir { path: path.into(), mode })
        .collect()
}

fn pause_recipe() -> Result<Recipe> {
    let mut entries = base_dirs();
    entries.push(Entry::File { path: "pause".into(), mode: 0o755, data: compile_pause()? });
    Ok(Recipe { entries, entrypoint: vec!["/pause".into()], cmd: vec![] })
}

/// Compile assets/pause.c statically; the source is embedded in the library so
/// this works from any working directory (tests, gantry-devenv).
fn compile_pause() -> Result<Vec<u8>> {
    let work = tempfile::tempdir().ctx(|| "create pause build dir".into())?;
    let source = work.path().join("pause.c");
    let binary = work.path().join("pause");
    std::fs::write(&source, PAUSE_SOURCE).ctx(|| format!("write {}", source.display()))?;
    cmd::run(Command::new("gcc").args(["-static", "-Os", "-s", "-o"]).arg(&binary).arg(&source))?;
    std::fs::read(&binary).ctx(|| format!("read {}", binary.display()))
}

fn busybox_recipe() -> Result<Recipe> {
    let mut entries = base_dirs();
    let busybox = std::fs::read(BUSYBOX_BINARY).ctx(|| format!("read {BUSYBOX_BINARY}"))?;
    entries.push(Entry::File { path: "bin/busybox".into(), mode: 0o755, data: busybox });
    entries.extend(
        busybox_applets()?
            .into_iter()
            .map(|applet| Entry::Symlink { path: format!("bin/{applet}"), target: "busybox".into() }),
    );
    entries.push(Entry::File {
        path: "etc/passwd".into(),
        mode: 0o644,
        data: b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n".to_vec(),
    });
    entries.push(Entry::File { path: "etc/group".into(), mode: 0o644, data: b"root:x:0:\nnobody:x:65534:\n".to_vec() });
    Ok(Recipe { entries, entrypoint: vec![], cmd: vec!["sh".into()] })
}

/// Every applet this busybox build has, sorted so the layer is deterministic.
fn busybox_applets() -> Result<Vec<String>> {
    let out = cmd::run(Command::new(BUSYBOX_BINARY).arg("--list"))?;
    let mut applets: Vec<String> = String::from_utf8_lossy(&out)
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty() && !name.contains('/') && *name != "busybox")
        .map(str::to_owned)
        .collect();
    applets.sort();
    applets.dedup();
    Ok(applets)
}

/// A tar header with everything that could vary between builds pinned down.
fn fixed_header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

/// Serialise `entries` as an uncompressed tar archive.
fn tar_bytes(entries: &[Entry]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let io = match entry {
            Entry::Dir { path, mode } => {
                let mut header = fixed_header(tar::EntryType::Directory, *mode, 0);
                builder.append_data(&mut header, format!("{path}/"), std::io::empty())
            }
            Entry::File { path, mode, data } => {
                let mut header = fixed_header(tar::EntryType::Regular, *mode, data.len() as u64);
                builder.append_data(&mut header, path, data.as_slice())
            }
            Entry::Symlink { path, target } => {
                let mut header = fixed_header(tar::EntryType::Symlink, 0o777, 0);
                builder.append_link(&mut header, path, target)
            }
        };
        io.ctx(|| "append tar entry".into())?;
    }
    builder.into_inner().ctx(|| "finish tar archive".into())
}

/// A content-addressed blob of the layout.
struct Blob {
    digest: String,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Self {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        Blob { digest, bytes }
    }

    fn json(value: &Value) -> Self {
        // serde_json's default map is sorted, so the encoding is stable.
        Blob::new(serde_json::to_vec(value).expect("serialising a JSON value cannot fail"))
    }

    fn descriptor(&self, media_type: &str) -> Value {
        json!({ "mediaType": media_type, "digest": self.digest, "size": self.bytes.len() })
    }

    fn layout_path(&self) -> String {
        format!("blobs/sha256/{}", self.digest.trim_start_matches("sha256:"))
    }
}

/// Build the complete OCI image-layout tarball for `reference`.
fn build_layout(reference: &str, recipe: &Recipe) -> Result<Vec<u8>> {
    let layer = Blob::new(tar_bytes(&recipe.entries)?);
    let config = Blob::json(&image_config(recipe, &layer.digest));
    let manifest = Blob::json(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config.descriptor(MEDIA_CONFIG),
        "layers": [layer.descriptor(MEDIA_LAYER)],
    }));
    let index = index_json(reference, &manifest);

    let mut entries = vec![
        json_file("oci-layout", &json!({ "imageLayoutVersion": "1.0.0" })),
        json_file("index.json", &index),
        Entry::Dir { path: "blobs".into(), mode: 0o755 },
        Entry::Dir { path: "blobs/sha256".into(), mode: 0o755 },
    ];
    for blob in [layer, config, manifest] {
        entries.push(Entry::File { path: blob.layout_path(), mode: 0o644, data: blob.bytes });
    }
    tar_bytes(&entries)
}

fn image_config(recipe: &Recipe, layer_digest: &str) -> Value {
    let mut runtime = json!({ "Env": [IMAGE_PATH_ENV], "WorkingDir": "/" });
    if !recipe.entrypoint.is_empty() {
        runtime["Entrypoint"] = json!(recipe.entrypoint);
    }
    if !recipe.cmd.is_empty() {
        runtime["Cmd"] = json!(recipe.cmd);
    }
    json!({
        "created": FIXED_TIME,
        "architecture": go_arch(),
        "os": "linux",
        "config": runtime,
        // Uncompressed layer: its diff ID is its digest.
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        "history": [{ "created": FIXED_TIME, "created_by": "gantry-testkit" }],
    })
}

/// index.json naming the manifest. `ctr images import` takes the image name
/// from `io.containerd.image.name`; the OCI annotation is set for other tools.
fn index_json(reference: &str, manifest: &Blob) -> Value {
    let mut descriptor = manifest.descriptor(MEDIA_MANIFEST);
    descriptor["annotations"] = json!({
        "io.containerd.image.name": reference,
        "org.opencontainers.image.ref.name": reference,
    });
    descriptor["platform"] = json!({ "architecture": go_arch(), "os": "linux" });
    json!({ "schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [descriptor] })
}

fn json_file(path: &str, value: &Value) -> Entry {
    Entry::File {
        path: path.into(),
        mode: 0o644,
        data: serde_json::to_vec(value).expect("serialising a JSON value cannot fail"),
    }
}

/// Import the tarballs into the `k8s.io` namespace (the one the CRI plugin
/// serves) of the containerd listening on `socket`, unpacking into `snapshotter`.
///
/// One after another on purpose: every `ctr import` ingests its index under
/// the same ref (`tar-index.json`), so concurrent imports contend for that
/// lock and back off for hundreds of milliseconds.
pub async fn import_images(socket: &Path, snapshotter: &str, images: &[BuiltImage]) -> Result<()> {
    for built in images {
        import_tarball(socket, snapshotter, &built.path).await?;
        tracing::debug!(image = built.image.reference(), "imported image");
    }
    Ok(())
}

/// Import one layout tarball, as [`import_images`] does.
pub async fn import_tarball(socket: &Path, snapshotter: &str, path: &Path) -> Result<()> {
    let mut ctr = Command::new("ctr");
    ctr.arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io", "images", "import"])
        .arg(format!("--snapshotter={snapshotter}"))
        .arg(path);
    cmd::run_async(ctr).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Read;

    use super::*;

    /// All regular files of a tar archive, by path.
    fn tar_files(bytes: &[u8]) -> HashMap<String, (tar::EntryType, Vec<u8>, String)> {
        let mut archive = tar::Archive::new(bytes);
        let mut files = HashMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let kind = entry.header().entry_type();
            let link = entry.link_name().unwrap().map(|l| l.to_string_lossy().into_owned()).unwrap_or_default();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            assert_eq!(entry.header().mtime().unwrap(), 0, "{path}: mtime not fixed");
            assert_eq!(entry.header().uid().unwrap(), 0, "{path}: uid not 0");
            files.insert(path, (kind, data, link));
        }
        files
    }

    /// Fetch a blob and check that its content hashes to the digest naming it.
    fn blob<'a>(files: &'a HashMap<String, (tar::EntryType, Vec<u8>, String)>, descriptor: &Value) -> &'a [u8] {
        let digest = descriptor["digest"].as_str().unwrap();
        let hex_digest = digest.strip_prefix("sha256:").unwrap();
        let data = &files[&format!("blobs/sha256/{hex_digest}")].1;
        assert_eq!(hex::encode(Sha256::digest(data)), hex_digest, "blob content mismatch");
        assert_eq!(descriptor["size"].as_u64().unwrap(), data.len() as u64);
        data
    }

    fn parse(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn busybox_layout_is_valid_and_deterministic() {
        let cache = tempfile::tempdir().unwrap();
        let built = ensure_image(TestImage::Busybox, cache.path()).unwrap();
        let bytes = std::fs::read(&built.path).unwrap();
        let files = tar_files(&bytes);

        assert_eq!(parse(&files["oci-layout"].1)["imageLayoutVersion"], "1.0.0");
        let index = parse(&files["index.json"].1);
        let descriptor = &index["manifests"][0];
        assert_eq!(descriptor["annotations"]["io.containerd.image.name"], BUSYBOX_IMAGE);
        assert_eq!(descriptor["annotations"]["org.opencontainers.image.ref.name"], BUSYBOX_IMAGE);

        let manifest = parse(blob(&files, descriptor));
        let config = parse(blob(&files, &manifest["config"]));
        let layer = blob(&files, &manifest["layers"][0]);
        assert_eq!(config["rootfs"]["diff_ids"][0], manifest["layers"][0]["digest"]);
        assert_eq!(config["architecture"], go_arch());
        assert_eq!(config["os"], "linux");
        assert_eq!(config["config"]["Cmd"], json!(["sh"]));

        let rootfs = tar_files(layer);
        let sh = &rootfs["bin/sh"];
        assert_eq!((sh.0, sh.2.as_str()), (tar::EntryType::Symlink, "busybox"));
        assert!(rootfs.contains_key("bin/wget"), "busybox applets missing");
        let passwd = String::from_utf8_lossy(&rootfs["etc/passwd"].1).into_owned();
        assert!(passwd.contains("nobody:x:65534:65534"), "{passwd}");

        // A second, independent build must give byte-identical output.
        let again = build_layout(BUSYBOX_IMAGE, &busybox_recipe().unwrap()).unwrap();
        assert!(again == bytes, "image build is not deterministic");
    }

    #[test]
    fn pause_layout_has_static_entrypoint() {
        let cache = tempfile::tempdir().unwrap();
        let built = ensure_image(TestImage::Pause, cache.path()).unwrap();
        let files = tar_files(&std::fs::read(&built.path).unwrap());
        let index = parse(&files["index.json"].1);
        let manifest = parse(blob(&files, &index["manifests"][0]));
        let config = parse(blob(&files, &manifest["config"]));
        assert_eq!(config["config"]["Entrypoint"], json!(["/pause"]));
        let rootfs = tar_files(blob(&files, &manifest["layers"][0]));
        let pause = &rootfs["pause"].1;
        assert_eq!(&pause[..4], b"\x7fELF");
    }

    #[test]
    fn pause_exits_zero_on_sigterm_and_sigint() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("pause");
        std::fs::write(&binary, compile_pause().unwrap()).unwrap();
        std::fs::set_permissions(&binary, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        for signal in [libc::SIGTERM, libc::SIGINT] {
            let mut child = Command::new(&binary).spawn().unwrap();
            // Signal until it exits: a signal that arrives before the handler
            // is installed would kill it by default, so wait for the
            // handlers via /proc before the first one.
            let status_path = format!("/proc/{}/status", child.id());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !std::fs::read_to_string(&status_path)
                .unwrap()
                .lines()
                .any(|l| l.starts_with("SigCgt:") && !l.ends_with("0000000000000000"))
            {
                assert!(std::time::Instant::now() < deadline, "pause never installed handlers");
                std::thread::yield_now();
            }
            unsafe { libc::kill(child.id() as i32, signal) };
            let status = child.wait().unwrap();
            assert_eq!(status.code(), Some(0), "signal {signal}: {status}");
        }
    }

    #[test]
    fn cached_image_is_reused() {
        let cache = tempfile::tempdir().unwrap();
        let first = ensure_image(TestImage::Busybox, cache.path()).unwrap();
        let modified = std::fs::metadata(&first.path).unwrap().modified().unwrap();
        let second = ensure_image(TestImage::Busybox, cache.path()).unwrap();
        assert_eq!(first, second);
        assert_eq!(std::fs::metadata(&second.path).unwrap().modified().unwrap(), modified);
    }
}
