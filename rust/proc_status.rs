//! This process's own figures from `/proc/self/status` (Linux): counters the
//! kernel keeps, read without walking the page tables.

/// The `field:   N kB` line of `/proc/self/status`, in bytes; None where
/// the kernel does not tell (another OS, a field it lacks).
pub fn own_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status_bytes(&status, field)
}

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
}
