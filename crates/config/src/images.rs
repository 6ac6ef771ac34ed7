//! Image settings: garbage collection (`imageGC*`, `imageMinimumGCAge`, `imageMaximumGCAge`,
//! `--pod-infra-container-image`) and pulls (`serializeImagePulls`, `maxParallelImagePulls`),
//! with upstream defaults and validation.

use std::time::Duration;

use super::file::KubeletConfiguration;
use super::flags::Flags;
use super::{ConfigError, GoDuration, Problem};

pub const DEFAULT_IMAGE_GC_HIGH_THRESHOLD_PERCENT: u8 = 85;
pub const DEFAULT_IMAGE_GC_LOW_THRESHOLD_PERCENT: u8 = 80;
pub const DEFAULT_IMAGE_MINIMUM_GC_AGE: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSettings {
    /// `imageGCHighThresholdPercent` / `--image-gc-high-threshold`, default 85 (100 disables GC).
    pub gc_high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent` / `--image-gc-low-threshold`, default 80.
    pub gc_low_threshold_percent: u8,
    /// `imageMinimumGCAge` / `--minimum-image-ttl-duration`, default 2m.
    pub minimum_gc_age: Duration,
    /// `imageMaximumGCAge`, default 0 (off).
    pub maximum_gc_age: Duration,
    /// `--pod-infra-container-image`: the sandbox image GC must keep; None = ask the runtime.
    pub pod_infra_container_image: Option<String>,
    /// `serializeImagePulls` / `--serialize-image-pulls`; unset means upstream's default (true
    /// unless `maxParallelImagePulls` is 2 or more).
    pub serialize_pulls: Option<bool>,
    /// `maxParallelImagePulls`, default unset (no limit when pulls are not serialized).
    pub max_parallel_pulls: Option<u32>,
}

impl Default for ImageSettings {
    fn default() -> Self {
        ImageSettings {
            gc_high_threshold_percent: DEFAULT_IMAGE_GC_HIGH_THRESHOLD_PERCENT,
            gc_low_threshold_percent: DEFAULT_IMAGE_GC_LOW_THRESHOLD_PERCENT,
            minimum_gc_age: DEFAULT_IMAGE_MINIMUM_GC_AGE,
            maximum_gc_age: Duration::ZERO,
            pod_infra_container_image: None,
            serialize_pulls: None,
            max_parallel_pulls: None,
        }
    }
}

type Invalid<'a> = &'a dyn Fn(&str, Problem) -> ConfigError;

/// Upstream names a setting as `field (--flag)` in its validation messages.
const HIGH: &str = "imageGCHighThresholdPercent (--image-gc-high-threshold)";
const LOW: &str = "imageGCLowThresholdPercent (--image-gc-low-threshold)";

fn percent(field: &str, label: &str, value: i32, invalid: Invalid) -> Result<u8, ConfigError> {
    u8::try_from(value).ok().filter(|p| *p <= 100).ok_or_else(|| {
        invalid(field, format!("invalid configuration: {label} {value} must be between 0 and 100, inclusive").into())
    })
}

fn duration(field: &str, value: GoDuration, invalid: Invalid) -> Result<Duration, ConfigError> {
    value.to_std().ok_or_else(|| invalid(field, format!("{value} must not be negative").into()))
}

impl ImageSettings {
    pub(super) fn apply_file(&mut self, c: &KubeletConfiguration, invalid: Invalid) -> Result<(), ConfigError> {
        if let Some(p) = c.image_gc_high_threshold_percent {
            self.gc_high_threshold_percent = percent("imageGCHighThresholdPercent", HIGH, p, invalid)?;
        }
        if let Some(p) = c.image_gc_low_threshold_percent {
            self.gc_low_threshold_percent = percent("imageGCLowThresholdPercent", LOW, p, invalid)?;
        }
        // Zero means "default" for the minimum age, as upstream's defaulting does.
        if let Some(d) = c.image_minimum_gc_age.filter(|d| !d.is_zero()) {
            self.minimum_gc_age = duration("imageMinimumGCAge", d, invalid)?;
        }
        if let Some(d) = c.image_maximum_gc_age {
            self.maximum_gc_age = duration("imageMaximumGCAge", d, invalid)?;
        }
        if let Some(serialize) = c.serialize_image_pulls {
            self.serialize_pulls = Some(serialize);
        }
        if let Some(n) = c.max_parallel_image_pulls {
            let positive = u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
                invalid(
                    "maxParallelImagePulls",
                    format!("invalid configuration: maxParallelImagePulls {n} must be a positive number").into(),
                )
            })?;
            self.max_parallel_pulls = Some(positive);
        }
        Ok(())
    }

    pub(super) fn apply_flags(&mut self, f: &Flags, invalid: Invalid) -> Result<(), ConfigError> {
        if let Some(p) = f.image_gc_high_threshold {
            self.gc_high_threshold_percent = percent("--image-gc-high-threshold", HIGH, p, invalid)?;
        }
        if let Some(p) = f.image_gc_low_threshold {
            self.gc_low_threshold_percent = percent("--image-gc-low-threshold", LOW, p, invalid)?;
        }
        if let Some(d) = f.minimum_image_ttl_duration {
            self.minimum_gc_age = duration("--minimum-image-ttl-duration", d, invalid)?;
        }
        if let Some(image) = f.pod_infra_container_image.as_deref() {
            self.pod_infra_container_image = (!image.is_empty()).then(|| image.to_string());
        }
        if let Some(serialize) = f.serialize_image_pulls {
            self.serialize_pulls = Some(serialize);
        }
        // Checked once both the file and the flags are applied, as upstream validates the result.
        self.check(invalid)
    }

    /// Whether image pulls are serialized, with upstream's defaulting.
    pub fn serialize_pulls(&self) -> bool {
        self.serialize_pulls.unwrap_or(self.max_parallel_pulls.is_none_or(|n| n < 2))
    }

    /// How many image pulls may run at once across all pods; `None` means no limit.
    pub fn parallel_pull_limit(&self) -> Option<usize> {
        if self.serialize_pulls() { Some(1) } else { self.max_parallel_pulls.map(|n| n as usize) }
    }

    fn check(&self, invalid: Invalid) -> Result<(), ConfigError> {
        if self.serialize_pulls() && self.max_parallel_pulls.is_some_and(|n| n > 1) {
            return Err(invalid(
                "maxParallelImagePulls",
                "invalid configuration: maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls (--serialize-image-pulls) is set to false".into(),
            ));
        }
        if self.gc_low_threshold_percent >= self.gc_high_threshold_percent {
            return Err(invalid(
                "imageGCLowThresholdPercent",
                format!(
                    "invalid configuration: {LOW} {} must be less than {HIGH} {}",
                    self.gc_low_threshold_percent, self.gc_high_threshold_percent
                )
                .into(),
            ));
        }
        if !self.maximum_gc_age.is_zero() && self.maximum_gc_age < self.minimum_gc_age {
            return Err(invalid(
                "imageMaximumGCAge",
                format!(
                    "invalid configuration: imageMaximumGCAge {:?} must be greater than imageMinimumGCAge {:?}",
                    self.maximum_gc_age, self.minimum_gc_age
                )
                .into(),
            ));
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

    #[test]
    fn file_values_are_validated_by_field_name() {
        let mut s = ImageSettings::default();
        let c = KubeletConfiguration { image_gc_high_threshold_percent: Some(101), ..Default::default() };
        let err = s.apply_file(&c, &invalid).unwrap_err().to_string();
        assert!(err.contains("imageGCHighThresholdPercent"), "{err}");

        let c = KubeletConfiguration {
            image_gc_high_threshold_percent: Some(50),
            image_gc_low_threshold_percent: Some(60),
            ..Default::default()
        };
        let mut s = ImageSettings::default();
        s.apply_file(&c, &invalid).unwrap();
        let err = s.apply_flags(&Flags::default(), &invalid).unwrap_err().to_string();
        assert!(
            err.contains("imageGCLowThresholdPercent (--image-gc-low-threshold) 60 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 50"),
            "{err}"
        );
    }

    fn pulls(file: &str, flags: &[&str]) -> Result<ImageSettings, String> {
        let c: KubeletConfiguration = serde_yaml_ng::from_str(file).unwrap();
        let f = Flags::parse_args(flags).unwrap();
        let mut s = ImageSettings::default();
        s.apply_file(&c, &invalid).map_err(|e| e.to_string())?;
        s.apply_flags(&f, &invalid).map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn pulls_are_serialized_by_default_and_unless_parallel_pulls_are_asked_for() {
        let limit = |file, flags| pulls(file, flags).unwrap().parallel_pull_limit();
        assert_eq!(limit("{}", &[]), Some(1));
        assert_eq!(limit("serializeImagePulls: false", &[]), None);
        assert_eq!(limit("serializeImagePulls: false\nmaxParallelImagePulls: 3", &[]), Some(3));
        // Without serializeImagePulls, maxParallelImagePulls >= 2 turns serialization off.
        assert_eq!(limit("maxParallelImagePulls: 2", &[]), Some(2));
        assert_eq!(limit("maxParallelImagePulls: 1", &[]), Some(1));
        assert_eq!(limit("{}", &["--serialize-image-pulls=false"]), None);
        assert_eq!(limit("serializeImagePulls: false", &["--serialize-image-pulls"]), Some(1));
    }

    #[test]
    fn parallel_pulls_are_validated_as_upstream() {
        let err = pulls("maxParallelImagePulls: 0", &[]).unwrap_err();
        assert!(err.contains("maxParallelImagePulls 0 must be a positive number"), "{err}");
        let err = pulls("serializeImagePulls: true\nmaxParallelImagePulls: 2", &[]).unwrap_err();
        assert!(err.contains("maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls"), "{err}");
        let err = pulls("maxParallelImagePulls: 2", &["--serialize-image-pulls=true"]).unwrap_err();
        assert!(err.contains("cannot be larger than 1"), "{err}");
        assert!(pulls("serializeImagePulls: true\nmaxParallelImagePulls: 1", &[]).is_ok());
    }

    #[test]
    fn file_overrides_defaults() {
        let mut s = ImageSettings::default();
        let c = KubeletConfiguration {
            image_gc_high_threshold_percent: Some(1),
            image_gc_low_threshold_percent: Some(0),
            image_minimum_gc_age: Some("0s".parse().unwrap()),
            image_maximum_gc_age: Some("1h".parse().unwrap()),
            ..Default::default()
        };
        s.apply_file(&c, &invalid).unwrap();
        assert_eq!((s.gc_high_threshold_percent, s.gc_low_threshold_percent), (1, 0));
        assert_eq!(s.minimum_gc_age, DEFAULT_IMAGE_MINIMUM_GC_AGE);
        assert_eq!(s.maximum_gc_age, Duration::from_secs(3600));
    }
}
