//! Memory figures from `/proc` (Linux): this process's own counters from
//! `/proc/self/status` (kept by the kernel, read without walking the page
//! tables), and another process's dirty pages from its `smaps_rollup` (a
//! walk of its page tables).

/// The `field:   N kB` line of `/proc/self/status`, in bytes; None where
/// the kernel does not tell (another OS, a field it lacks).
pub fn own_status_bytes(field: &str) -> Option<u64> {
    field_bytes("/proc/self/status", field)
}

/// The pages process `pid` alone has written (`Private_Dirty` of its
/// `smaps_rollup`), in bytes; None where the kernel does not tell or the
/// process is gone.
pub fn private_dirty_bytes(pid: u32) -> Option<u64> {
    field_bytes(&format!("/proc/{pid}/smaps_rollup"), "Private_Dirty")
}

fn field_bytes(path: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    status_bytes(&text, field)
}

/// The `field:   N kB` line of such a file's text (a count where it has no
/// unit), in bytes.
fn status_bytes(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(field)?.strip_prefix(':')?;
        let mut words = value.split_whitespace();
        let amount: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => amount.checked_mul(1024),
            None => Some(amount),
            Some(_) => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_in_kilobytes_reads_in_bytes() {
        let status = "Name:\tpython\nVmRSS:\t  2048 kB\nRssAnon:\t  1024 kB\nThreads:\t7\n";
        assert_eq!(status_bytes(status, "RssAnon"), Some(1024 * 1024));
        assert_eq!(status_bytes(status, "Threads"), Some(7));
        // A field that only starts the same is another field.
        assert_eq!(status_bytes(status, "Rss"), None);
        assert_eq!(status_bytes(status, "Name"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_holds_anonymous_memory() {
        let held = vec![1_u8; 8 << 20];
        let resident = own_status_bytes("RssAnon").expect("Linux tells RssAnon");
        assert!(resident >= held.len() as u64, "{resident}");
        assert_eq!(held.iter().map(|&b| u64::from(b)).sum::<u64>(), 8 << 20);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_written_pages_of_its_own() {
        let held = vec![1_u8; 8 << 20];
        let dirty = private_dirty_bytes(std::process::id()).expect("Linux tells Private_Dirty");
        assert!(dirty >= held.len() as u64, "{dirty}");
        assert_eq!(held.iter().map(|&b| u64::from(b)).sum::<u64>(), 8 << 20);
    }

    #[test]
    fn a_process_that_is_gone_tells_nothing() {
        assert_eq!(private_dirty_bytes(u32::MAX), None);
    }

    #[test]
    fn a_rollup_line_reads_in_bytes() {
        let rollup =
            "55d0-7ffe ---p 00000000 00:00 0 [rollup]\nRss:  4096 kB\nPrivate_Dirty:   12 kB\n";
        assert_eq!(status_bytes(rollup, "Private_Dirty"), Some(12 * 1024));
    }
}
