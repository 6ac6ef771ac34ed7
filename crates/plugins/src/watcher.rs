//! Plugin registration (upstream `pluginmanager`): the sockets in `<root-dir>/plugins_registry`
//! (those there at start-up, new ones, removed ones; dot files are ignored). For each socket the
//! node calls the plugin's `Registration.GetInfo`, hands the plugin to the handler of its type
//! (validate, then register), and tells the plugin the outcome with `NotifyRegistrationStatus`
//! (with upstream's error text on failure). A removed socket deregisters its plugin. A failed
//! registration is retried with backoff while the socket stays; a socket re-created (new
//! modification time) registers again.
//!
//! Handlers: `DevicePlugin` (the device manager) and `CSIPlugin` (the CSI drivers). Another
//! plugin type is refused until a handler for it is added to [`Handlers`].

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::api::registration::registration_client::RegistrationClient;
use crate::api::registration::{InfoRequest, PluginInfo, RegistrationStatus};
use crate::csi::{CSI_PLUGIN, CsiDrivers, CsiError};
use crate::devices::DeviceManager;

/// `<root-dir>/plugins_registry`.
pub const DIR: &str = "plugins_registry";
/// Upstream's plugin type names.
pub const DEVICE_PLUGIN: &str = "DevicePlugin";
/// Upstream's `GetInfo` timeout.
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// Upstream's `NotifyRegistrationStatus` timeout.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the sockets are compared with the registered plugins (upstream's reconciler).
const RECONCILE_PERIOD: Duration = Duration::from_secs(1);
const BACKOFF_START: Duration = Duration::from_millis(500);
/// Upstream's operation executor caps its exponential backoff at about 2 minutes.
const BACKOFF_MAX: Duration = Duration::from_secs(122);

/// The handler of each plugin type.
#[derive(Clone)]
pub struct Handlers {
    pub devices: DeviceManager,
    pub csi: CsiDrivers,
}

/// Why a plugin was not registered (upstream's texts; the plugin gets them back).
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("failed to dial socket {}, err: {source}", socket.display())]
    Dial { socket: PathBuf, source: std::io::Error },
    #[error("failed to get plugin info using RPC GetInfo at socket {}, err: {}", socket.display(), crate::devices::GrpcError(status.clone()))]
    GetInfo { socket: PathBuf, status: tonic::Status },
    #[error("RegisterPlugin error -- no handler registered for plugin type: {kind} at socket {}", socket.display())]
    NoHandler { kind: String, socket: PathBuf },
    #[error("RegisterPlugin error -- plugin validation failed with err: {0}")]
    Validation(#[source] crate::devices::RegisterError),
    #[error("RegisterPlugin error -- plugin registration failed with err: {0}")]
    Registration(#[source] crate::devices::RegisterError),
    #[error("RegisterPlugin error -- plugin validation failed with err: {0}")]
    CsiValidation(#[source] CsiError),
    #[error("RegisterPlugin error -- plugin registration failed with err: {0}")]
    CsiRegistration(#[source] CsiError),
}

/// A plugin registered from a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Registered {
    kind: String,
    name: String,
    modified: Option<SystemTime>,
}

/// A socket whose registration failed, and when to try again.
struct Failed {
    modified: Option<SystemTime>,
    retry_at: Instant,
    backoff: Duration,
}

/// Watches `<root_dir>/plugins_registry` and registers its plugins; runs for the node's
/// lifetime.
pub async fn run(root_dir: PathBuf, handlers: Handlers) {
    let dir = root_dir.join(DIR);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::error!(dir = %dir.display(), error = %e, "cannot create the plugin registration directory");
    }
    let (tx, mut events) = mpsc::unbounded_channel();
    let _watcher = watch(&dir, tx);
    let mut registered: BTreeMap<PathBuf, Registered> = BTreeMap::new();
    let mut failed: BTreeMap<PathBuf, Failed> = BTreeMap::new();
    tracing::info!(dir = %dir.display(), "watching for plugins");
    loop {
        reconcile(&dir, &handlers, &mut registered, &mut failed).await;
        tokio::select! {
            Some(()) = events.recv() => {}
            () = tokio::time::sleep(RECONCILE_PERIOD) => {}
        }
    }
}

/// inotify on the directory; `None` (with the periodic look only) when it cannot be set up.
fn watch(dir: &Path, events: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
    let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok_and(|e| wakes(&e)) {
            let _ = events.send(());
        }
    });
    let mut watcher = watcher.inspect_err(|e| tracing::warn!(error = %e, "cannot watch for plugins")).ok()?;
    if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot watch for plugins; looking every second");
        return None;
    }
    Some(watcher)
}

/// Whether an event can mean a socket came or went. Not an access: each look opens the
/// directory, and waking on that would make the watcher look again at once, for ever.
fn wakes(event: &notify::Event) -> bool {
    !matches!(event.kind, notify::EventKind::Access(_))
}

/// The sockets in `dir` (not dot files) with their modification times.
fn sockets(dir: &Path) -> BTreeMap<PathBuf, Option<SystemTime>> {
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeMap::new() };
    entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            meta.file_type().is_socket().then(|| (e.path(), meta.modified().ok()))
        })
        .collect()
}

async fn reconcile(
    dir: &Path,
    handlers: &Handlers,
    registered: &mut BTreeMap<PathBuf, Registered>,
    failed: &mut BTreeMap<PathBuf, Failed>,
) {
    let present = sockets(dir);
    // Gone, or re-created since it registered: deregister.
    let stale: Vec<PathBuf> = registered
        .iter()
        .filter(|(path, r)| present.get(*path).is_none_or(|m| *m != r.modified))
        .map(|(path, _)| path.clone())
        .collect();
    for path in stale {
        if let Some(r) = registered.remove(&path) {
            tracing::info!(socket = %path.display(), kind = %r.kind, name = %r.name, "plugin socket removed; deregistering");
            deregister(handlers, &r);
        }
    }
    failed.retain(|path, f| present.get(path).is_some_and(|m| *m == f.modified));
    let now = Instant::now();
    for (path, modified) in present {
        if registered.contains_key(&path) || failed.get(&path).is_some_and(|f| f.retry_at > now) {
            continue;
        }
        match register(&path, handlers).await {
            Ok(info) => {
                failed.remove(&path);
                tracing::info!(socket = %path.display(), kind = %info.r#type, name = %info.name, "plugin registered");
                registered.insert(path, Registered { kind: info.r#type, name: info.name, modified });
            }
            Err(e) => {
                let backoff = failed.get(&path).map_or(BACKOFF_START, |f| (f.backoff * 2).min(BACKOFF_MAX));
                tracing::warn!(socket = %path.display(), error = %e, retry_in = ?backoff, "plugin registration failed");
                failed.insert(path, Failed { modified, retry_at: now + backoff, backoff });
            }
        }
    }
}

/// Registers the plugin on `socket` (upstream `RegisterPlugin` operation).
async fn register(socket: &Path, handlers: &Handlers) -> Result<PluginInfo, RegistrationError> {
    let channel = crate::dial::channel(socket)
        .await
        .map_err(|source| RegistrationError::Dial { socket: socket.to_path_buf(), source })?;
    let mut client = RegistrationClient::new(channel);
    let get_info = |status| RegistrationError::GetInfo { socket: socket.to_path_buf(), status };
    let info = tokio::time::timeout(GET_INFO_TIMEOUT, client.get_info(InfoRequest {}))
        .await
        .map_err(|_| get_info(tonic::Status::deadline_exceeded("context deadline exceeded")))?
        .map_err(get_info)?
        .into_inner();
    let outcome = dispatch(socket, &info, handlers).await;
    let status = RegistrationStatus {
        plugin_registered: outcome.is_ok(),
        error: outcome.as_ref().err().map(ToString::to_string).unwrap_or_default(),
    };
    match tokio::time::timeout(NOTIFY_TIMEOUT, client.notify_registration_status(status)).await {
        Ok(Ok(_)) => {}
        Ok(Err(s)) => {
            tracing::warn!(socket = %socket.display(), error = %s, "cannot notify the plugin of its registration status")
        }
        Err(_) => {
            tracing::warn!(socket = %socket.display(), "notifying the plugin of its registration status timed out")
        }
    }
    outcome.map(|()| info)
}

/// Hands the plugin to the handler of its type.
async fn dispatch(socket: &Path, info: &PluginInfo, handlers: &Handlers) -> Result<(), RegistrationError> {
    // An empty endpoint: the plugin serves its API on the registration socket itself.
    let endpoint = if info.endpoint.is_empty() { socket.to_path_buf() } else { PathBuf::from(&info.endpoint) };
    match info.r#type.as_str() {
        DEVICE_PLUGIN => {
            handlers.devices.count_registration(&info.name);
            DeviceManager::validate(&info.name, &info.supported_versions).map_err(RegistrationError::Validation)?;
            handlers.devices.connect(&info.name, &endpoint).await.map_err(RegistrationError::Registration)
        }
        CSI_PLUGIN => {
            CsiDrivers::validate(&info.name, &info.supported_versions).map_err(RegistrationError::CsiValidation)?;
            let driver =
                handlers.csi.register(&info.name, &endpoint).await.map_err(RegistrationError::CsiRegistration)?;
            tracing::info!(driver = %driver.name, node_id = %driver.node_id, stages = driver.stages, "CSI driver registered");
            Ok(())
        }
        other => Err(RegistrationError::NoHandler { kind: other.to_string(), socket: socket.to_path_buf() }),
    }
}

fn deregister(handlers: &Handlers, r: &Registered) {
    match r.kind.as_str() {
        DEVICE_PLUGIN => handlers.devices.disconnect(&r.name),
        CSI_PLUGIN => handlers.csi.deregister(&r.name),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sockets_that_are_not_dot_files_are_plugins() {
        let dir = tempfile::tempdir().unwrap();
        let _a = std::os::unix::net::UnixListener::bind(dir.path().join("a.sock")).unwrap();
        let _hidden = std::os::unix::net::UnixListener::bind(dir.path().join(".hidden.sock")).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a socket").unwrap();
        let found: Vec<PathBuf> = sockets(dir.path()).into_keys().collect();
        assert_eq!(found, vec![dir.path().join("a.sock")]);
        assert!(sockets(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn looking_at_the_directory_does_not_wake_the_watcher_but_a_new_socket_does() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut events) = mpsc::unbounded_channel();
        let _watcher = watch(dir.path(), tx).expect("inotify");
        let woken = |events: &mut mpsc::UnboundedReceiver<()>, within: Duration| {
            let deadline = Instant::now() + within;
            while Instant::now() < deadline {
                if events.try_recv().is_ok() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        };
        sockets(dir.path());
        assert!(!woken(&mut events, Duration::from_millis(300)), "a look woke the watcher: it would spin");
        let _a = std::os::unix::net::UnixListener::bind(dir.path().join("a.sock")).unwrap();
        assert!(woken(&mut events, Duration::from_secs(10)), "a new socket did not wake the watcher");
    }
}
