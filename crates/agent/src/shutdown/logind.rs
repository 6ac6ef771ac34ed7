//! logind over D-Bus (`zbus`), as upstream's node shutdown manager uses it: a `delay` inhibitor
//! lock on shutdown, logind's `InhibitDelayMaxUSec`, the `PrepareForShutdown` signal, and the
//! `logind.conf.d` drop-in that raises `InhibitDelayMaxSec` (logind rereads its configuration on
//! SIGHUP, which systemd's `KillUnit` delivers).

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

/// Where the drop-in goes, and its name: upstream's, so that a node switching between the Go
/// kubelet and Gantry keeps one file.
pub const DROP_IN_DIR: &str = "/etc/systemd/logind.conf.d";
pub const DROP_IN_FILE: &str = "99-kubelet.conf";

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1",
    gen_blocking = false
)]
pub trait Login {
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<zbus::zvariant::OwnedFd>;

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;

    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
pub trait Systemd {
    fn kill_unit(&self, name: &str, who: &str, signal: i32) -> zbus::Result<()>;
}

/// An inhibitor lock: shutdown waits (up to `InhibitDelayMaxSec`) until it is dropped.
#[derive(Debug)]
pub struct InhibitLock {
    _fd: OwnedFd,
}

/// The system bus's logind.
pub struct Logind {
    connection: zbus::Connection,
    login: LoginProxy<'static>,
}

impl Logind {
    pub async fn connect() -> zbus::Result<Logind> {
        let connection = zbus::Connection::system().await?;
        // The property changes behind our back (a drop-in and a reload): read it every time.
        let login = LoginProxy::builder(&connection).cache_properties(zbus::proxy::CacheProperties::No).build().await?;
        Ok(Logind { connection, login })
    }

    /// logind's `InhibitDelayMaxUSec`: how long a delay lock may hold a shutdown.
    pub async fn inhibit_delay(&self) -> zbus::Result<Duration> {
        Ok(Duration::from_micros(self.login.inhibit_delay_max_usec().await?))
    }

    /// Takes the `delay` lock on shutdown, as upstream's kubelet names it.
    pub async fn inhibit_shutdown(&self) -> zbus::Result<InhibitLock> {
        let fd =
            self.login.inhibit("shutdown", "kubelet", "Kubelet needs time to handle node shutdown", "delay").await?;
        Ok(InhibitLock { _fd: fd.into() })
    }

    /// `PrepareForShutdown(start)` signals from now on.
    pub async fn shutdown_signals(&self) -> zbus::Result<PrepareForShutdownStream> {
        self.login.receive_prepare_for_shutdown().await
    }

    /// Makes logind reread its configuration (SIGHUP through systemd's `KillUnit`).
    pub async fn reload(&self) -> zbus::Result<()> {
        let systemd = SystemdProxy::new(&self.connection).await?;
        systemd.kill_unit("systemd-logind.service", "all", 1).await
    }
}

/// The drop-in's text for `delay` (whole seconds, rounded as upstream's `%.0f`).
pub fn drop_in(delay: Duration) -> String {
    format!("# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={:.0}\n", delay.as_secs_f64())
}

/// Writes the drop-in under `dir` (0755 directory, 0644 file, as upstream).
pub fn write_drop_in(dir: &Path, delay: Duration) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
    let path = dir.join(DROP_IN_FILE);
    std::fs::write(&path, drop_in(delay))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_in_is_upstreams() {
        assert_eq!(drop_in(Duration::from_secs(30)), "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=30\n");
        let dir = tempfile::tempdir().unwrap();
        let path = write_drop_in(&dir.path().join("logind.conf.d"), Duration::from_secs(45)).unwrap();
        assert_eq!(path.file_name().unwrap(), "99-kubelet.conf");
        assert!(std::fs::read_to_string(path).unwrap().ends_with("InhibitDelayMaxSec=45\n"));
    }
}
