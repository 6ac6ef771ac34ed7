//! Handing the pages of the agent's own code back to the system once the node has settled.
//! The code a start-up burst runs (configuration, TLS and client set-up, first pod starts) is
//! mapped from the binary and stays resident although a settled node rarely runs it again.
//! Paging the binary's read-only mappings out is safe: they are clean pages of the file, and
//! whatever the node runs again faults back in from it on demand.
//!
//! Measured with the density bench at 110 settled pods (release build): the binary's code was
//! 14.4 MiB resident and its constants 1.8 MiB; after the page-out, the code came back to
//! 10.9 MiB within 5 s and 11.7 MiB within 60 s, the constants to 1.5 MiB, so file-backed RSS
//! went 17.9–18.3 → 13.6–15.5 MiB. The pages actually touched in 60 s are fewer (4.4 MiB of
//! code, 0.6 MiB of constants, by `clear_refs` and `Referenced`), but the pages stay in the
//! page cache and each fault maps the cached pages around it (the kernel's fault-around, 64
//! KiB), and the hot code is scattered over the whole binary. `MADV_RANDOM` before the
//! page-out, tried to stop that, changed nothing (it only stops read-ahead from disk).

use std::sync::atomic::{AtomicBool, Ordering};

/// A failure is said once at warn, then at debug: it repeats after every settled burst.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Pages out the executable's read-only file mappings (its code and constants).
pub fn page_out() {
    if let Err(e) = try_page_out() {
        if WARNED.swap(true, Ordering::Relaxed) {
            tracing::debug!(error = %e, "cannot page out the agent's code");
        } else {
            tracing::warn!(error = %e, "cannot page out the agent's code; it stays resident");
        }
    }
}

fn try_page_out() -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    for (start, end) in read_only_mappings_of(&maps, &exe.to_string_lossy()) {
        // SAFETY: the range is one of this process's own read-only file mappings: paging it
        // out changes no content; the kernel maps the pages back from the file when touched.
        if unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The address ranges of `/proc/self/maps` lines that map the file `path` without write
/// permission. Writable mappings are left alone: their written pages are no longer the file's.
fn read_only_mappings_of(maps: &str, path: &str) -> Vec<(usize, usize)> {
    maps.lines().filter_map(|line| read_only_mapping_of(line, path)).collect()
}

fn read_only_mapping_of(line: &str, path: &str) -> Option<(usize, usize)> {
    // address perms offset dev inode pathname; the pathname may hold spaces.
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let mapped = fields.nth(3)?.trim_start();
    if mapped != path || perms.as_bytes().get(1) != Some(&b'-') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some((usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0a0000000-55d0a0400000 r--p 00000000 103:02 1835 /usr/bin/gantry kubelet
55d0a0400000-55d0a1000000 r-xp 00400000 103:02 1835 /usr/bin/gantry kubelet
55d0a1000000-55d0a1100000 r--p 01000000 103:02 1835 /usr/bin/gantry kubelet
55d0a1100000-55d0a1101000 rw-p 01100000 103:02 1835 /usr/bin/gantry kubelet
55d0a1101000-55d0a1200000 rw-p 00000000 00:00 0 
55d0a2000000-55d0a2100000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000200000 r-xp 00028000 103:02 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]";

    #[test]
    fn finds_the_read_only_mappings_of_the_executable_only() {
        assert_eq!(
            read_only_mappings_of(MAPS, "/usr/bin/gantry kubelet"),
            vec![(0x55d0a0000000, 0x55d0a0400000), (0x55d0a0400000, 0x55d0a1000000), (0x55d0a1000000, 0x55d0a1100000)]
        );
    }

    #[test]
    fn a_deleted_executable_is_still_found_and_other_files_are_not() {
        let maps = "00400000-00500000 r-xp 00000000 08:01 7 /bin/gantry (deleted)\n\
                    00500000-00600000 r-xp 00000000 08:01 8 /bin/gantry-other";
        assert_eq!(read_only_mappings_of(maps, "/bin/gantry (deleted)"), vec![(0x400000, 0x500000)]);
        assert!(read_only_mappings_of(maps, "/bin/gantry").is_empty());
        assert!(read_only_mappings_of("not a maps line", "/bin/gantry").is_empty());
    }

    /// The resident KiB of this process's read-only mappings of its executable.
    fn resident_code_kib() -> u64 {
        let exe = std::env::current_exe().unwrap().to_string_lossy().into_owned();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut ours = false;
        let mut kib = 0;
        for line in smaps.lines() {
            if let Some(rss) = line.strip_prefix("Rss:") {
                kib += if ours { rss.trim().trim_end_matches(" kB").parse::<u64>().unwrap() } else { 0 };
            } else if line.split(' ').next().is_some_and(|f| f.contains('-')) {
                ours = read_only_mapping_of(line, &exe).is_some();
            }
        }
        kib
    }

    #[test]
    fn pages_out_the_running_executable_which_keeps_running() {
        let before = resident_code_kib();
        assert!(before > 0, "the test binary's code is resident while it runs");
        try_page_out().expect("madvise(MADV_PAGEOUT) over the executable's mappings");
        let after = resident_code_kib();
        // What faulted back in since (this test's own code, the other tests') is a fraction.
        assert!(after < before / 2, "resident code {before} KiB before paging out, {after} KiB after");
    }
}
