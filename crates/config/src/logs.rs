//! Container log rotation settings (`containerLogMaxSize`, `containerLogMaxFiles`,
//! `containerLogMaxWorkers`, `containerLogMonitorInterval`), with upstream defaults and
//! validation messages.

use std::time::Duration;

use super::file::KubeletConfiguration;
use super::flags::Flags;
use super::{ConfigError, GoDuration, Problem};
use gantry_vocab::quantity;

pub const DEFAULT_CONTAINER_LOG_MAX_SIZE: u64 = 10 * 1024 * 1024;
pub const DEFAULT_CONTAINER_LOG_MAX_FILES: u32 = 5;
pub const DEFAULT_CONTAINER_LOG_MAX_WORKERS: u32 = 1;
pub const DEFAULT_CONTAINER_LOG_MONITOR_INTERVAL: Duration = Duration::from_secs(10);
/// Upstream refuses to check log sizes more often than this.
const MIN_MONITOR_INTERVAL: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// `containerLogMaxSize` / `--container-log-max-size` in bytes, default 10Mi.
    pub max_size: u64,
    /// `containerLogMaxFiles` / `--container-log-max-files`, default 5 (the current file included).
    pub max_files: u32,
    /// `containerLogMaxWorkers`, default 1: how many containers are rotated at once.
    pub max_workers: u32,
    /// `containerLogMonitorInterval`, default 10s.
    pub monitor_interval: Duration,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            max_size: DEFAULT_CONTAINER_LOG_MAX_SIZE,
            max_files: DEFAULT_CONTAINER_LOG_MAX_FILES,
            max_workers: DEFAULT_CONTAINER_LOG_MAX_WORKERS,
            monitor_interval: DEFAULT_CONTAINER_LOG_MONITOR_INTERVAL,
        }
    }
}

type Invalid<'a> = &'a dyn Fn(&str, Problem) -> ConfigError;

fn max_size(field: &str, value: &str, invalid: Invalid) -> Result<u64, ConfigError> {
    let bytes = quantity::parse_units(value).map_err(|e| {
        invalid(
            field,
            format!("invalid configuration: containerLogMaxSize (--container-log-max-size) {value:?} must be a valid resource.Quantity: {e}").into(),
        )
    })?;
    u64::try_from(bytes).map_err(|_| {
        invalid(
            field,
            format!(
                "invalid configuration: containerLogMaxSize (--container-log-max-size) {value} must not be negative"
            )
            .into(),
        )
    })
}

fn max_files(field: &str, n: i32, invalid: Invalid) -> Result<u32, ConfigError> {
    u32::try_from(n).ok().filter(|n| *n > 1).ok_or_else(|| {
        invalid(
            field,
            format!(
                "invalid configuration: containerLogMaxFiles (--container-log-max-files) {n} must be greater than 1"
            )
            .into(),
        )
    })
}

impl LogSettings {
    pub(super) fn apply_file(&mut self, c: &KubeletConfiguration, invalid: Invalid) -> Result<(), ConfigError> {
        // Empty / zero values mean "default", as upstream's defaulting does.
        if let Some(v) = c.container_log_max_size.as_deref().filter(|v| !v.is_empty()) {
            self.max_size = max_size("containerLogMaxSize", v, invalid)?;
        }
        if let Some(n) = c.container_log_max_files.filter(|n| *n != 0) {
            self.max_files = max_files("containerLogMaxFiles", n, invalid)?;
        }
        if let Some(n) = c.container_log_max_workers.filter(|n| *n != 0) {
            self.max_workers = u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
                invalid(
                    "containerLogMaxWorkers",
                    "invalid configuration: containerLogMaxWorkers must be greater than or equal to 1".into(),
                )
            })?;
        }
        if let Some(d) = c.container_log_monitor_interval.filter(|d: &GoDuration| !d.is_zero()) {
            self.monitor_interval = d.to_std().filter(|d| *d >= MIN_MONITOR_INTERVAL).ok_or_else(|| {
                invalid(
                    "containerLogMonitorInterval",
                    "invalid configuration: containerLogMonitorInterval must be a positive time duration greater than or equal to 3s".into(),
                )
            })?;
        }
        Ok(())
    }

    pub(super) fn apply_flags(&mut self, f: &Flags, invalid: Invalid) -> Result<(), ConfigError> {
        if let Some(v) = f.container_log_max_size.as_deref() {
            self.max_size = max_size("--container-log-max-size", v, invalid)?;
        }
        if let Some(n) = f.container_log_max_files {
            self.max_files = max_files("--container-log-max-files", n, invalid)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Input;

    fn invalid(field: &str, problem: Problem) -> ConfigError {
        ConfigError::InvalidValue { input: Input::CommandLine, field: field.into(), problem: Box::new(problem) }
    }

    fn resolve(file: &str, flags: &[&str]) -> Result<LogSettings, String> {
        let c: KubeletConfiguration = serde_yaml_ng::from_str(file).unwrap();
        let f = Flags::parse_args(flags).unwrap();
        let mut s = LogSettings::default();
        s.apply_file(&c, &invalid).map_err(|e| e.to_string())?;
        s.apply_flags(&f, &invalid).map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn defaults_file_and_flags() {
        assert_eq!(resolve("{}", &[]).unwrap(), LogSettings::default());
        let s = resolve(
            "containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\ncontainerLogMaxWorkers: 2\ncontainerLogMonitorInterval: 5s",
            &["--container-log-max-size=2Ki"],
        )
        .unwrap();
        assert_eq!(
            s,
            LogSettings { max_size: 2048, max_files: 3, max_workers: 2, monitor_interval: Duration::from_secs(5) }
        );
        assert_eq!(resolve("{}", &["--container-log-max-files=2"]).unwrap().max_files, 2);
    }

    #[test]
    fn validated_as_upstream() {
        let e = resolve("containerLogMaxFiles: 1", &[]).unwrap_err();
        assert!(e.contains("containerLogMaxFiles (--container-log-max-files) 1 must be greater than 1"), "{e}");
        let e = resolve("{}", &["--container-log-max-files=-2"]).unwrap_err();
        assert!(e.contains("-2 must be greater than 1"), "{e}");
        let e = resolve("containerLogMaxSize: lots", &[]).unwrap_err();
        assert!(
            e.contains("containerLogMaxSize (--container-log-max-size) \"lots\" must be a valid resource.Quantity"),
            "{e}"
        );
        let e = resolve("containerLogMonitorInterval: 1s", &[]).unwrap_err();
        assert!(e.contains("greater than or equal to 3s"), "{e}");
        let e = resolve("containerLogMaxWorkers: -1", &[]).unwrap_err();
        assert!(e.contains("containerLogMaxWorkers must be greater than or equal to 1"), "{e}");
    }
}
