//! The systemd cgroup driver's pod cgroups: transient slice units (`kubepods.slice`,
//! `kubepods-burstable.slice`, `kubepods-burstable-pod<uid>.slice`) that systemd creates, limits
//! and removes when asked over D-Bus, as upstream's systemd cgroup manager does. Gantry never
//! writes the cgroup files of these slices; it only lists which exist.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use zbus::zvariant::{OwnedObjectPath, Value};

use super::cgroups::CgroupFs;
use gantry_pod::resources::{self, CgroupValues};

/// How long one systemd job may take (upstream's 30 s).
const JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// systemd's "infinity" for sizes, counts and times.
const INFINITY: u64 = u64::MAX;

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
trait Manager {
    fn subscribe(&self) -> zbus::Result<()>;

    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, &[(&str, Value<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    fn set_unit_properties(&self, name: &str, runtime: bool, properties: &[(&str, Value<'_>)]) -> zbus::Result<()>;

    #[zbus(signal)]
    fn job_removed(&self, id: u32, job: zbus::zvariant::ObjectPath<'_>, unit: &str, result: &str) -> zbus::Result<()>;
}

/// Why the systemd cgroup driver cannot work here.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("cgroupDriver is \"systemd\" but the host does not run systemd (/run/systemd/system is missing)")]
    NotRunning,
    #[error("cgroupDriver is \"systemd\" but systemd cannot be reached over D-Bus: {0}")]
    Bus(#[from] zbus::Error),
}

/// Whether the host runs systemd (upstream's check: `/run/systemd/system` is a directory).
pub fn running() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Slice units through systemd's manager on the system bus.
pub struct Slices {
    manager: ManagerProxy<'static>,
    /// The runtime the D-Bus connection lives on; [`CgroupFs`] calls come from blocking threads.
    runtime: tokio::runtime::Handle,
    /// The cgroup v2 mount, to list slices.
    mount: PathBuf,
}

fn dbus_error(what: &str, unit: &str, e: zbus::Error) -> io::Error {
    io::Error::other(format!("error {what} systemd unit `{unit}`: {e}"))
}

/// Whether systemd answered with the named D-Bus error.
fn is_error(e: &zbus::Error, name: &str) -> bool {
    matches!(e, zbus::Error::MethodError(n, _, _) if n.as_str() == name)
}

/// `CPUQuotaPerSecUSec` from a CFS quota and period, rounded up to 10 ms as systemd stores it.
fn quota_per_sec(quota: i64, period: i64) -> u64 {
    let per_sec = (quota as u64 * 1_000_000).div_ceil(period.max(1) as u64);
    per_sec.div_ceil(10_000) * 10_000
}

/// The unit properties for a cgroup's values (upstream's resource properties).
fn resource_properties(v: &CgroupValues) -> Vec<(&'static str, Value<'static>)> {
    let mut props = Vec::new();
    if v.cpu_shares > 0 {
        props.push(("CPUWeight", Value::U64(resources::cpu_weight(v.cpu_shares) as u64)));
    }
    if v.cpu_quota > 0 {
        props.push(("CPUQuotaPerSecUSec", Value::U64(quota_per_sec(v.cpu_quota, v.cpu_period))));
        props.push(("CPUQuotaPeriodUSec", Value::U64(v.cpu_period as u64)));
    }
    if v.memory_limit > 0 {
        props.push(("MemoryMax", Value::U64(v.memory_limit as u64)));
    }
    if v.memory_min > 0 {
        props.push(("MemoryMin", Value::U64(v.memory_min as u64)));
    }
    match v.pids_limit {
        n if n > 0 => props.push(("TasksMax", Value::U64(n as u64))),
        -1 => props.push(("TasksMax", Value::U64(INFINITY))),
        _ => {}
    }
    props
}

/// The unit and its parent slice for a path like `/kubepods.slice/kubepods-burstable.slice`.
fn unit_and_parent(path: &str) -> (String, String) {
    let mut parts = path.trim_matches('/').rsplit('/');
    let unit = parts.next().unwrap_or_default().to_string();
    let parent = parts.next().map_or_else(|| "-.slice".to_string(), str::to_string);
    (unit, parent)
}

impl Slices {
    /// Connects to systemd on the system bus and subscribes to its job signals.
    pub async fn connect(mount: impl Into<PathBuf>) -> zbus::Result<Slices> {
        let connection = zbus::Connection::system().await?;
        let manager = ManagerProxy::new(&connection).await?;
        // systemd sends JobRemoved only to subscribed clients.
        manager.subscribe().await?;
        Ok(Slices { manager, runtime: tokio::runtime::Handle::current(), mount: mount.into() })
    }

    /// Runs `call`, which queues a job, and waits until systemd finished the job.
    async fn job<F>(&self, call: F) -> Result<(), JobError>
    where
        F: std::future::Future<Output = zbus::Result<OwnedObjectPath>>,
    {
        // Listen before asking: a quick job may be gone before the call returns.
        let mut removed = self.manager.receive_job_removed().await.map_err(JobError::Bus)?;
        let job = call.await.map_err(JobError::Bus)?;
        let finished = async {
            while let Some(signal) = removed.next().await {
                if let Ok(args) = signal.args()
                    && *args.job() == *job
                {
                    return Some(args.result().to_string());
                }
            }
            None
        };
        match tokio::time::timeout(JOB_TIMEOUT, finished).await {
            Ok(Some(result)) if result == "done" => Ok(()),
            Ok(Some(result)) => Err(JobError::Result(result)),
            Ok(None) => Err(JobError::Closed),
            Err(_) => Err(JobError::Timeout),
        }
    }

    async fn ensure_slice(&self, path: &str, values: Option<&CgroupValues>) -> io::Result<()> {
        let (unit, parent) = unit_and_parent(path);
        let resources = values.map(resource_properties).unwrap_or_default();
        let mut props: Vec<(&str, Value<'_>)> = vec![
            ("Description", Value::from(format!("Kubernetes pod cgroup {unit}"))),
            ("Wants", Value::from(vec![parent])),
            ("DefaultDependencies", Value::Bool(false)),
            ("MemoryAccounting", Value::Bool(true)),
            ("CPUAccounting", Value::Bool(true)),
            ("IOAccounting", Value::Bool(true)),
            ("TasksAccounting", Value::Bool(true)),
        ];
        props.extend(resources.iter().map(|(k, v)| (*k, v.try_clone().expect("plain values clone"))));
        match self.job(self.manager.start_transient_unit(&unit, "replace", &props, &[])).await {
            Ok(()) => Ok(()),
            // Already there (created before, or implicitly as a parent): update its limits.
            Err(JobError::Bus(e)) if is_error(&e, "org.freedesktop.systemd1.UnitExists") => {
                if resources.is_empty() {
                    return Ok(());
                }
                self.manager
                    .set_unit_properties(&unit, true, &resources)
                    .await
                    .map_err(|e| dbus_error("updating", &unit, e))
            }
            Err(e) => Err(e.into_io("creating", &unit)),
        }
    }

    async fn remove_slice(&self, path: &str) -> io::Result<()> {
        let (unit, _) = unit_and_parent(path);
        match self.job(self.manager.stop_unit(&unit, "replace")).await {
            Err(JobError::Bus(e)) if is_error(&e, "org.freedesktop.systemd1.NoSuchUnit") => Ok(()),
            other => other.map_err(|e| e.into_io("stopping", &unit)),
        }
    }
}

/// How a systemd job went wrong.
enum JobError {
    /// The call itself failed.
    Bus(zbus::Error),
    /// The job finished with another result than `done`.
    Result(String),
    Timeout,
    Closed,
}

impl JobError {
    fn into_io(self, what: &str, unit: &str) -> io::Error {
        match self {
            JobError::Bus(e) => dbus_error(what, unit, e),
            JobError::Result(r) => io::Error::other(format!("error {what} systemd unit `{unit}`: got `{r}`")),
            JobError::Timeout => {
                io::Error::new(io::ErrorKind::TimedOut, format!("Timeout waiting for systemd ({what} {unit})"))
            }
            JobError::Closed => io::Error::other(format!("error {what} systemd unit `{unit}`: the bus closed")),
        }
    }
}

impl CgroupFs for Slices {
    fn ensure(&self, path: &str, values: Option<&CgroupValues>) -> io::Result<()> {
        self.runtime.block_on(self.ensure_slice(path, values))
    }

    fn remove(&self, path: &str) -> io::Result<()> {
        if !self.mount.join(path.trim_start_matches('/')).exists() {
            return Ok(());
        }
        self.runtime.block_on(self.remove_slice(path))
    }

    fn children(&self, path: &str) -> Vec<String> {
        let entries = std::fs::read_dir(self.mount.join(path.trim_start_matches('/'))).into_iter().flatten().flatten();
        entries.filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quota_as_systemd_stores_it() {
        assert_eq!(quota_per_sec(50_000, 100_000), 500_000, "500m");
        assert_eq!(quota_per_sec(1_000, 100_000), 10_000, "10m");
        assert_eq!(quota_per_sec(1_500, 100_000), 20_000, "15m rounds up to 20 ms");
    }

    #[test]
    fn properties_for_a_pod() {
        let v = CgroupValues {
            cpu_shares: 512,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit: 64 << 20,
            pids_limit: -1,
            memory_min: 32 << 20,
        };
        let props = resource_properties(&v);
        let get = |k: &str| props.iter().find(|(n, _)| *n == k).map(|(_, v)| v.try_clone().unwrap());
        assert_eq!(get("MemoryMin"), Some(Value::U64(32 << 20)), "MemoryQoS");
        assert_eq!(get("CPUWeight"), Some(Value::U64(20)));
        assert_eq!(get("CPUQuotaPerSecUSec"), Some(Value::U64(500_000)));
        assert_eq!(get("MemoryMax"), Some(Value::U64(64 << 20)));
        assert_eq!(get("TasksMax"), Some(Value::U64(INFINITY)), "no podPidsLimit: unlimited");
        assert!(resource_properties(&CgroupValues::default()).is_empty());
    }

    #[test]
    fn units_and_parents() {
        assert_eq!(unit_and_parent("/kubepods.slice"), ("kubepods.slice".into(), "-.slice".into()));
        assert_eq!(
            unit_and_parent("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice"),
            ("kubepods-burstable-pod1_2.slice".into(), "kubepods-burstable.slice".into())
        );
    }
}
