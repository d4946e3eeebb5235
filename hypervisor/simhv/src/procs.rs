//! Which processes are a domain's, for freezing them during the last round of a
//! migration.
//!
//! A simulated domain's processes are whatever can change its memory: the processes
//! connected to its `hv.sock` (its guest daemon, its drivers), and the processes mapping
//! frames of its memory file (applications that received pages from the guest daemon
//! and never talk to the hypervisor themselves). Processes connected as another domain
//! are left out: those are dom0's daemons (or other guests) mapping the domain's grants,
//! which must keep running. The daemon itself is never one.
//!
//! A mapping of the memory file shows in `/proc/PID/maps` with the file's inode and a
//! `/memfd:` name; the inode tells the domains apart (every memory file has its own).

use std::collections::BTreeSet;
use std::fs;

/// Pids of the processes mapping the memory file with inode `inode`, per `/proc`.
/// Processes that vanish or cannot be read meanwhile are skipped.
pub(crate) fn mapping_inode(inode: u64) -> BTreeSet<i32> {
    let mut found = BTreeSet::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(maps) = fs::read_to_string(entry.path().join("maps")) else {
            continue;
        };
        if maps.lines().any(|l| maps_line_is(l, inode)) {
            found.insert(pid);
        }
    }
    found
}

/// Whether a line of `/proc/PID/maps` maps the memfd with inode `inode`.
fn maps_line_is(line: &str, inode: u64) -> bool {
    // address perms offset dev inode pathname
    let mut fields = line.split_whitespace();
    let Some(ino) = fields.nth(4).and_then(|f| f.parse::<u64>().ok()) else {
        return false;
    };
    ino == inode && fields.next().is_some_and(|p| p.starts_with("/memfd:"))
}

/// The domain's processes: those `attached` to it and those mapping its memory file,
/// less those attached to other domains and this daemon.
pub(crate) fn of_domain(inode: u64, attached: &[i32], others: &[i32]) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut pids = mapping_inode(inode);
    pids.extend(attached.iter().copied());
    for p in others {
        pids.remove(p);
    }
    pids.remove(&me);
    pids.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_match_by_inode_and_memfd_name() {
        let l = "7f00-7f01 rw-s 00002000 00:01 4242 /memfd:xmx-simhv:dom3 (deleted)";
        assert!(maps_line_is(l, 4242));
        assert!(!maps_line_is(l, 424));
        assert!(!maps_line_is(
            "7f00-7f01 rw-s 00000000 08:01 4242 /usr/lib/libc.so.6",
            4242
        ));
        assert!(!maps_line_is("7f00-7f01 rw-p 00000000 00:00 0", 0));
        assert!(!maps_line_is("garbage", 1));
    }

    #[test]
    fn a_process_mapping_a_memfd_is_found_and_the_daemon_is_never_one() {
        use std::os::unix::fs::MetadataExt;
        let fd = nix::sys::memfd::memfd_create(
            c"xmx-procs-test",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .unwrap();
        let file = fs::File::from(fd);
        file.set_len(4096).unwrap();
        let inode = file.metadata().unwrap().ino();
        let region =
            xmx_hv::sim::mmap::Region::map_frames(std::os::fd::AsFd::as_fd(&file), &[0], true)
                .unwrap();
        let me = std::process::id() as i32;
        assert!(mapping_inode(inode).contains(&me));
        assert!(of_domain(inode, &[me], &[]).is_empty());
        assert_eq!(of_domain(inode, &[1], &[]), vec![1]);
        assert!(of_domain(inode, &[1], &[1]).is_empty());
        drop(region);
        assert!(!mapping_inode(inode).contains(&me));
    }
}
