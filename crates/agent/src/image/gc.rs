//! Which images the garbage collector removes, and why the others stay (pure).
//!
//! As upstream, every image is tracked with when it was first detected and when it was last
//! seen in use. Images already present when Gantry starts count as detected long ago, so a
//! restart does not protect them for `imageMinimumGCAge`. Candidates are removed least recently
//! used first (ties: first detected first) until enough bytes are freed.

use std::collections::{HashMap, HashSet};

use gantry_pod::Nanos;

/// One image as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    pub id: String,
    /// Repo tags and repo digests.
    pub names: Vec<String>,
    pub size: u64,
    /// CRI `Image.pinned` (KEP-2040): the runtime asks that it is never removed.
    pub pinned: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    first_detected: Nanos,
    last_used: Nanos,
}

/// What the collector remembers between passes.
#[derive(Debug, Clone, Default)]
pub struct ImageRecords {
    records: HashMap<String, Record>,
}

/// Why an image is kept this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    Pinned,
    InUse,
    SandboxImage,
    TooYoung,
}

/// Image GC policy, resolved from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub high_threshold_percent: u8,
    pub low_threshold_percent: u8,
    pub min_age: Nanos,
    /// 0 = off.
    pub max_age: Nanos,
}

/// Capacity and free space of the image filesystem, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity: u64,
    pub available: u64,
}

impl FsUsage {
    pub fn usage_percent(&self) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        100 - (self.available.min(self.capacity) * 100 / self.capacity)
    }
}

/// The decision of one pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Image ids to remove, in order.
    pub remove: Vec<String>,
    /// Bytes the thresholds ask to free (0 when usage is below the high threshold).
    pub bytes_to_free: u64,
    /// Bytes the removals free.
    pub bytes_freed: u64,
}

impl Plan {
    /// The upstream `FreeDiskSpaceFailed` message when the low threshold cannot be reached.
    pub fn shortfall_message(&self) -> Option<String> {
        (self.bytes_freed < self.bytes_to_free).then(|| {
            format!(
                "Failed to garbage collect required amount of images. Attempted to free {} bytes, but only found {} bytes eligible to free.",
                self.bytes_to_free, self.bytes_freed
            )
        })
    }
}

impl ImageRecords {
    /// Records what the runtime has now. `startup` marks images found on the first pass as
    /// detected long ago. Images in `in_use` (ids or names) are used now.
    pub fn observe(&mut self, images: &[ImageInfo], in_use: &HashSet<String>, now: Nanos, startup: bool) {
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| present.contains(id.as_str()));
        for image in images {
            let first_detected = if startup { 0 } else { now };
            let record = self.records.entry(image.id.clone()).or_insert(Record { first_detected, last_used: 0 });
            if is_used(image, in_use) {
                record.last_used = now;
            }
        }
    }

    /// Forgets an image that was removed.
    pub fn forget(&mut self, id: &str) {
        self.records.remove(id);
    }

    /// Why `image` must stay this pass, or `None` if it may go.
    pub fn keep_reason(
        &self,
        image: &ImageInfo,
        in_use: &HashSet<String>,
        sandbox_image: &str,
        policy: &Policy,
        now: Nanos,
    ) -> Option<Keep> {
        if image.pinned {
            return Some(Keep::Pinned);
        }
        if is_used(image, in_use) {
            return Some(Keep::InUse);
        }
        if is_sandbox_image(image, sandbox_image) {
            return Some(Keep::SandboxImage);
        }
        let record = self.records.get(&image.id)?;
        (now - record.first_detected < policy.min_age).then_some(Keep::TooYoung)
    }

    /// Chooses the images to remove: everything unused for longer than `max_age`, then, when
    /// usage is at or above the high threshold, the least recently used until usage would be
    /// below the low threshold.
    pub fn plan(
        &self,
        images: &[ImageInfo],
        in_use: &HashSet<String>,
        sandbox_image: &str,
        fs: FsUsage,
        policy: &Policy,
        now: Nanos,
    ) -> Plan {
        let mut candidates: Vec<(&ImageInfo, Record)> = images
            .iter()
            .filter(|i| self.keep_reason(i, in_use, sandbox_image, policy, now).is_none())
            .filter_map(|i| self.records.get(&i.id).map(|r| (i, *r)))
            .collect();
        candidates.sort_by_key(|(i, r)| (r.last_used, r.first_detected, i.id.clone()));

        let mut plan = Plan { bytes_to_free: bytes_to_free(fs, policy), ..Plan::default() };
        for (image, record) in candidates {
            let too_old = policy.max_age > 0 && now - record.last_used.max(record.first_detected) > policy.max_age;
            if too_old || plan.bytes_freed < plan.bytes_to_free {
                plan.remove.push(image.id.clone());
                plan.bytes_freed += image.size;
            }
        }
        plan
    }
}

fn bytes_to_free(fs: FsUsage, policy: &Policy) -> u64 {
    // 100 % disables the collector, as upstream.
    if policy.high_threshold_percent >= 100 || fs.usage_percent() < policy.high_threshold_percent as u64 {
        return 0;
    }
    let target_available = fs.capacity.saturating_mul(100 - policy.low_threshold_percent as u64) / 100;
    target_available.saturating_sub(fs.available)
}

fn is_used(image: &ImageInfo, in_use: &HashSet<String>) -> bool {
    in_use.contains(&image.id) || image.names.iter().any(|n| in_use.contains(n) || in_use.contains(&normalize(n)))
}

fn is_sandbox_image(image: &ImageInfo, sandbox_image: &str) -> bool {
    if sandbox_image.is_empty() {
        return false;
    }
    let wanted = normalize(sandbox_image);
    image.id == sandbox_image || image.names.iter().any(|n| normalize(n) == wanted)
}

/// `busybox` and `docker.io/library/busybox:latest` name the same image.
pub fn normalize(name: &str) -> String {
    let (repo, suffix) = match name.find('@') {
        Some(at) => (&name[..at], &name[at..]),
        None => {
            let last = name.rsplit('/').next().unwrap_or(name);
            if last.contains(':') { (name, "") } else { (name, ":latest") }
        }
    };
    let first = repo.split('/').next().unwrap_or(repo);
    let has_host = repo.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let full = if has_host {
        repo.to_string()
    } else if repo.contains('/') {
        format!("docker.io/{repo}")
    } else {
        format!("docker.io/library/{repo}")
    };
    format!("{full}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_pod::SECOND;

    const MINUTE: Nanos = 60 * SECOND;
    const GB: u64 = 1 << 30;

    fn image(id: &str, size: u64) -> ImageInfo {
        ImageInfo { id: id.into(), names: vec![format!("example.com/{id}:v1")], size, pinned: false }
    }

    fn policy() -> Policy {
        Policy { high_threshold_percent: 85, low_threshold_percent: 80, min_age: 2 * MINUTE, max_age: 0 }
    }

    /// 90 % used on a 100 GB disk: 10 GB must go to reach 80 %.
    fn full_disk() -> FsUsage {
        FsUsage { capacity: 100 * GB, available: 10 * GB }
    }

    fn used(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn nothing_goes_below_the_high_threshold() {
        let images = vec![image("a", GB)];
        let mut records = ImageRecords::default();
        records.observe(&images, &used(&[]), 0, true);
        let fs = FsUsage { capacity: 100 * GB, available: 16 * GB };
        let plan = records.plan(&images, &used(&[]), "", fs, &policy(), 10 * MINUTE);
        assert_eq!(plan, Plan::default());
    }

    #[test]
    fn least_recently_used_goes_first_until_the_low_threshold() {
        let images = vec![image("old", 6 * GB), image("recent", 6 * GB), image("never", 6 * GB), image("spare", GB)];
        let mut records = ImageRecords::default();
        records.observe(&images, &used(&["old", "recent"]), MINUTE, true);
        records.observe(&images, &used(&["recent"]), 5 * MINUTE, false);
        let plan = records.plan(&images, &used(&[]), "", full_disk(), &policy(), 10 * MINUTE);
        // "never" and "spare" were never used (same age, id order), then "old"; that frees 13 GB >= 10.
        assert_eq!(plan.remove, vec!["never", "spare", "old"]);
        assert_eq!(plan.bytes_to_free, 10 * GB);
        assert_eq!(plan.bytes_freed, 13 * GB);
        assert_eq!(plan.shortfall_message(), None);
    }

    #[test]
    fn pinned_in_use_sandbox_and_young_images_stay_and_say_why() {
        let mut pinned = image("pinned", 50 * GB);
        pinned.pinned = true;
        let images =
            vec![pinned, image("busy", 50 * GB), image("pause", 50 * GB), image("unused", 50 * GB), image("young", GB)];
        let mut records = ImageRecords::default();
        records.observe(&images[..4], &used(&[]), 0, true);
        records.observe(&images, &used(&[]), 9 * MINUTE, false);
        let in_use = used(&["example.com/busy:v1"]);
        let now = 10 * MINUTE;
        let p = policy();
        let reasons: Vec<Option<Keep>> =
            images.iter().map(|i| records.keep_reason(i, &in_use, "example.com/pause:v1", &p, now)).collect();
        assert_eq!(
            reasons,
            vec![Some(Keep::Pinned), Some(Keep::InUse), Some(Keep::SandboxImage), None, Some(Keep::TooYoung)]
        );
        let plan = records.plan(&images, &in_use, "example.com/pause:v1", full_disk(), &p, now);
        assert_eq!(plan.remove, vec!["unused"]);
    }

    #[test]
    fn shortfall_is_reported_with_the_numbers() {
        let mut pinned = image("pinned", 20 * GB);
        pinned.pinned = true;
        let images = vec![pinned, image("small", GB)];
        let mut records = ImageRecords::default();
        records.observe(&images, &used(&[]), 0, true);
        let plan = records.plan(&images, &used(&[]), "", full_disk(), &policy(), 10 * MINUTE);
        assert_eq!(plan.remove, vec!["small"]);
        assert_eq!(
            plan.shortfall_message().unwrap(),
            format!(
                "Failed to garbage collect required amount of images. Attempted to free {} bytes, but only found {} bytes eligible to free.",
                10 * GB,
                GB
            )
        );
    }

    #[test]
    fn maximum_age_removes_long_unused_images_even_with_free_disk() {
        let images = vec![image("stale", GB), image("fresh", GB)];
        let mut records = ImageRecords::default();
        records.observe(&images, &used(&["fresh"]), 0, true);
        records.observe(&images, &used(&["fresh"]), 50 * MINUTE, false);
        let fs = FsUsage { capacity: 100 * GB, available: 90 * GB };
        let p = Policy { max_age: 30 * MINUTE, ..policy() };
        let plan = records.plan(&images, &used(&[]), "", fs, &p, 60 * MINUTE);
        assert_eq!(plan.remove, vec!["stale"]);
    }

    #[test]
    fn disabled_at_one_hundred_percent() {
        let images = vec![image("a", GB)];
        let mut records = ImageRecords::default();
        records.observe(&images, &used(&[]), 0, true);
        let fs = FsUsage { capacity: 100 * GB, available: 0 };
        let p = Policy { high_threshold_percent: 100, ..policy() };
        assert!(records.plan(&images, &used(&[]), "", fs, &p, 10 * MINUTE).remove.is_empty());
    }

    #[test]
    fn short_and_full_names_match() {
        assert_eq!(normalize("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(normalize("user/app:1"), "docker.io/user/app:1");
        assert_eq!(normalize("gantry.local/pause:v1"), "gantry.local/pause:v1");
        assert_eq!(normalize("localhost:5000/app"), "localhost:5000/app:latest");
    }
}
