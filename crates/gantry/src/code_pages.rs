//! Handing the pages of the agent's own code back to the system once the node has settled.
//! The code a start-up burst runs (configuration, TLS and client set-up, first pod starts) is
//! mapped from the binary and stays resident although a settled node rarely runs it again.
//! Paging the binary's read-only mappings out is safe: they are clean pages of the file, and
//! whatever the node runs again faults back in from it on demand.
//!
//! What faults back in is decided by the link order. Each fault maps the cached pages around
//! it too (the kernel's fault-around, 64 KiB), so the 1.8 MiB of functions a settled node ran
//! brought back 11–12 MiB while they were spread over the whole binary. Release builds now
//! put them first, next to each other (`build.rs`, `hot-functions.txt`): at 110 settled pods
//! the code comes back to about 2 MiB and stays there (density bench, file-backed RSS 14.7 →
//! 5.6 MiB).

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
    page_out_ranges(&read_only_mappings_of(&maps, &exe.to_string_lossy()))
}

/// `ranges` must be read-only file mappings of this process.
fn page_out_ranges(ranges: &[(usize, usize)]) -> std::io::Result<()> {
    for &(start, end) in ranges {
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

    /// The resident KiB of this process's mapping that starts at `start`.
    fn resident_kib(start: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let header = format!("{start:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&header));
        let rss = lines.find_map(|l| l.strip_prefix("Rss:")).expect("the mapping is in smaps");
        rss.trim().trim_end_matches(" kB").parse().unwrap()
    }

    #[test]
    fn the_executable_can_be_paged_out() {
        try_page_out().expect("madvise(MADV_PAGEOUT) over the executable's mappings");
    }

    #[test]
    fn a_paged_out_file_mapping_leaves_memory_and_reads_back_the_same() {
        const LEN: usize = 1 << 20;
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[7u8; LEN]).unwrap();
        file.sync_all().unwrap();
        // SAFETY: a new private read-only mapping of a file this test owns, unmapped below.
        let addr = unsafe {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
            libc::mmap(std::ptr::null_mut(), LEN, libc::PROT_READ, libc::MAP_PRIVATE, fd, 0)
        };
        assert_ne!(addr, libc::MAP_FAILED);
        // SAFETY: the mapping is LEN bytes long and readable.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, LEN) };
        let sum = |b: &[u8]| b.iter().step_by(4096).map(|&x| u64::from(std::hint::black_box(x))).sum::<u64>();
        let expected = sum(bytes);
        assert_eq!(resident_kib(addr as usize), (LEN / 1024) as u64, "every page read: resident");
        page_out_ranges(&[(addr as usize, addr as usize + LEN)]).unwrap();
        assert_eq!(resident_kib(addr as usize), 0, "nothing touched it since: none resident");
        assert_eq!(sum(bytes), expected, "the pages read back from the file");
        // SAFETY: unmapped once, after its last use.
        assert_eq!(unsafe { libc::munmap(addr, LEN) }, 0);
    }
}
