//! The frames of its own domain's memory this process mapped from another process's
//! hand-off ([`crate::handoff`]): an application maps its endpoints and windows this
//! way, without a grant table of its own. When the domain moves to another host they are
//! mapped again, at the same addresses, from the destination's memory
//! ([`super::SimPlatform::follow_move`]), so every pointer into them stays valid.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex, Weak};

use super::mmap::Region;
use crate::Result;

/// Which memory file a mapping shows: its device and inode (a domain's memory is one file,
/// different for every domain instance).
pub(crate) type MemoryId = (u64, u64);

/// The identity of the memory file behind `fd`.
pub(crate) fn memory_id(fd: BorrowedFd<'_>) -> Result<MemoryId> {
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(std::io::Error::from)?;
    Ok((st.st_dev as u64, st.st_ino as u64))
}

/// A live import: the mapping, the frames it shows in page order, and whose memory.
struct Import {
    region: Weak<Region>,
    frames: Vec<u32>,
    memory: MemoryId,
}

/// Every live import of this process.
static IMPORTS: Mutex<Vec<Import>> = Mutex::new(Vec::new());

/// Keep track of `region`, a mapping of `frames` of the memory behind `memory`.
pub(crate) fn register(
    region: Region,
    frames: Vec<u32>,
    memory: BorrowedFd<'_>,
) -> Result<Arc<Region>> {
    let memory = memory_id(memory)?;
    let region = Arc::new(region);
    let mut all = crate::lock(&IMPORTS);
    all.retain(|i| i.region.strong_count() > 0);
    all.push(Import {
        region: Arc::downgrade(&region),
        frames,
        memory,
    });
    Ok(region)
}

/// Map the live imports of the memory `from` again from `mem`, the domain's memory on its
/// new host, at the same addresses; every live import if `from` is unknown (a process of
/// one domain, which imports only its own memory). Returns how many were remapped.
///
/// Only the moving domain's: a process that holds several domains' memory (a test running
/// simulated hosts side by side) must not see another domain's pages replaced by frames of
/// this one's, which may lie past the end of the new file (SIGBUS on the next access).
pub(crate) fn remap_all(from: Option<MemoryId>, mem: BorrowedFd<'_>) -> Result<usize> {
    let to = memory_id(mem)?;
    let live: Vec<(Arc<Region>, Vec<u32>)> = {
        let mut all = crate::lock(&IMPORTS);
        all.retain(|i| i.region.strong_count() > 0);
        all.iter_mut()
            .filter(|i| from.is_none_or(|f| i.memory == f))
            .filter_map(|i| {
                let region = i.region.upgrade()?;
                i.memory = to;
                Some((region, i.frames.clone()))
            })
            .collect()
    };
    for (region, frames) in &live {
        region.remap_frames(mem, frames, true)?;
    }
    Ok(live.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PAGE_SIZE;
    use std::os::fd::{AsFd, OwnedFd};

    fn memory(byte: u8) -> OwnedFd {
        let fd = nix::sys::memfd::memfd_create(
            c"xmx-imports-test",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .unwrap();
        let file = std::fs::File::from(fd);
        file.set_len(2 * PAGE_SIZE as u64).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &vec![byte; 2 * PAGE_SIZE], 0).unwrap();
        file.into()
    }

    fn first_byte(r: &Region) -> u8 {
        // SAFETY: `r` maps at least one page, readable, for as long as it lives.
        unsafe { std::ptr::read_volatile(r.as_ptr()) }
    }

    #[test]
    fn a_move_remaps_only_the_moving_domains_imports() {
        let (a, b, a_moved) = (memory(0xaa), memory(0xbb), memory(0xcc));
        let of_a = register(
            Region::map_frames(a.as_fd(), &[1], true).unwrap(),
            vec![1],
            a.as_fd(),
        )
        .unwrap();
        let of_b = register(
            Region::map_frames(b.as_fd(), &[1], true).unwrap(),
            vec![1],
            b.as_fd(),
        )
        .unwrap();
        let from = memory_id(a.as_fd()).unwrap();
        assert_eq!(remap_all(Some(from), a_moved.as_fd()).unwrap(), 1);
        assert_eq!(first_byte(&of_a), 0xcc, "a's import shows a's new memory");
        assert_eq!(first_byte(&of_b), 0xbb, "b's import is left alone");
        // A second move of a starts from its new memory.
        let again = memory(0xdd);
        let from = memory_id(a_moved.as_fd()).unwrap();
        assert_eq!(remap_all(Some(from), again.as_fd()).unwrap(), 1);
        assert_eq!(first_byte(&of_a), 0xdd);
        assert_eq!(first_byte(&of_b), 0xbb);
    }
}
