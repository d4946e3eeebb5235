//! Setup `shm`: two processes and one shared mapping, the ceiling for co-located peers.
//!
//! The server creates a file (under /dev/shm) holding a control page and two
//! single-producer single-consumer rings of fixed-size slots, one per direction; the client
//! maps the same file. A message is copied into a slot, published by a release store of
//! the ring's `head`, consumed by an acquire load, copied out, and the slot is handed back
//! by a release store of `tail`. A waiter spins for a bounded time and then sleeps on a
//! futex on the index it waits for, after raising that index's waiter flag; whoever moves
//! the index wakes the futex when the flag is up. Spinning alone would be fastest only
//! while both processes own a core: on a loaded two-core machine two spinners take turns
//! at the scheduler's pace.
//!
//! Control page layout (little-endian, each index on its own cache line):
//!
//! | offset | field                                     |
//! |--------|-------------------------------------------|
//! | 0      | magic, stored (release) once the rest is set |
//! | 8      | slot payload capacity in bytes            |
//! | 16     | slots per ring                            |
//! | 64     | ring 0 (client to server) head; +8: its waiter flag |
//! | 128    | ring 0 tail; +8: its waiter flag          |
//! | 192    | ring 1 (server to client) head; +8: its waiter flag |
//! | 256    | ring 1 tail; +8: its waiter flag          |
//!
//! The futex of an index is its low 32 bits (the file is little-endian, as the machine).
//!
//! Each slot is a 64-byte header (message length, u64) followed by the payload capacity
//! rounded up to 64 bytes; ring 0 starts at 4096, ring 1 right after it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::exchange::Channel;

const MAGIC: u64 = 0x786d_782d_7368_6d31; // "xmx-shm1"
const CONTROL_LEN: usize = 4096;
const LINE: usize = 64;
const OFF_MAGIC: usize = 0;
const OFF_SLOT_LEN: usize = 8;
const OFF_SLOTS: usize = 16;
/// Offsets of (head, tail) of rings 0 and 1.
const OFF_RING: [(usize, usize); 2] = [(64, 128), (192, 256)];
/// Offset of an index's waiter flag from the index.
const WAITER_FLAG: usize = 8;
/// A peer that does not move for this long is gone.
const PEER_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of ring a stream may fill: deeper rings add nothing once copies dominate.
const RING_BUDGET: u64 = 32 << 20;

/// Slots per ring for messages of `size` bytes.
pub fn slots_for(size: u64) -> u64 {
    (RING_BUDGET / size.max(1)).clamp(2, 256)
}

fn slot_stride(slot_len: usize) -> usize {
    LINE + slot_len.div_ceil(LINE) * LINE
}

/// Total file length for the given geometry, `None` on overflow.
fn file_len(slot_len: usize, slots: usize) -> Option<usize> {
    slot_stride(slot_len)
        .checked_mul(slots)?
        .checked_mul(2)?
        .checked_add(CONTROL_LEN)
}

/// A shared read-write mapping of a whole file, unmapped on drop.
struct FileMapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl FileMapping {
    fn new(file: &File, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of `len` bytes of an open file at a kernel-chosen
        // address; nothing else in this process refers to that range. The file is at least
        // `len` bytes long (checked or set by the callers), so no access faults.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    /// The 8-byte word at `off`, for atomic access shared with the other process.
    fn word(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= CONTROL_LEN && off + 8 <= self.len);
        // SAFETY: the offset is 8-aligned inside the page-aligned mapping (asserted), the
        // reference lives no longer than `self` (the mapping), and the other process only
        // ever accesses these words atomically too.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range mapped in `new`; no reference into it outlives
        // `self` (words borrow `self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One end of the shared-memory channel.
pub struct ShmChannel {
    map: FileMapping,
    slot_len: usize,
    slots: u64,
    /// Ring this end produces into and ring it consumes from.
    tx_ring: usize,
    rx_ring: usize,
    /// Our own copies of the indices we write (the shared ones are only published).
    tx_head: u64,
    rx_tail: u64,
    /// How long a waiter polls before it sleeps.
    spin: Duration,
}

// SAFETY: the mapping is owned by the channel and used through `&mut self` only.
unsafe impl Send for ShmChannel {}

impl ShmChannel {
    /// Server end: create `path` sized for `slots` slots of `slot_len` bytes per ring.
    pub fn create(path: &Path, slot_len: usize, slots: u64, spin: Duration) -> io::Result<Self> {
        let too_big = || io::Error::new(io::ErrorKind::InvalidInput, "shared ring too large");
        let len = usize::try_from(slots)
            .ok()
            .and_then(|s| file_len(slot_len, s))
            .ok_or_else(too_big)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        file.set_len(len as u64)?;
        let map = FileMapping::new(&file, len)?;
        map.word(OFF_SLOT_LEN)
            .store(slot_len as u64, Ordering::Relaxed);
        map.word(OFF_SLOTS).store(slots, Ordering::Relaxed);
        map.word(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(Self {
            map,
            slot_len,
            slots,
            tx_ring: 1,
            rx_ring: 0,
            tx_head: 0,
            rx_tail: 0,
            spin,
        })
    }

    /// Client end: map the file the server created. Its geometry comes from the other
    /// process, so it is checked against the file's real length before use.
    pub fn open(path: &Path, spin: Duration) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let actual = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
        if actual < CONTROL_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared file too short",
            ));
        }
        let map = FileMapping::new(&file, actual)?;
        if map.word(OFF_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared file not initialised",
            ));
        }
        let slot_len =
            usize::try_from(map.word(OFF_SLOT_LEN).load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        let slots = map.word(OFF_SLOTS).load(Ordering::Relaxed);
        let fits = usize::try_from(slots)
            .ok()
            .and_then(|s| file_len(slot_len, s))
            .is_some_and(|l| l <= actual);
        if slots == 0 || !fits {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared ring geometry does not fit the file",
            ));
        }
        Ok(Self {
            map,
            slot_len,
            slots,
            tx_ring: 0,
            rx_ring: 1,
            tx_head: 0,
            rx_tail: 0,
            spin,
        })
    }

    /// Offset of slot `index` (taken modulo the ring size) of ring `ring`.
    fn slot_offset(&self, ring: usize, index: u64) -> usize {
        let stride = slot_stride(self.slot_len);
        let ring_len = stride * self.slots as usize;
        CONTROL_LEN + ring * ring_len + (index % self.slots) as usize * stride
    }

    fn head(&self, ring: usize) -> &AtomicU64 {
        self.map.word(OFF_RING[ring].0)
    }

    fn tail(&self, ring: usize) -> &AtomicU64 {
        self.map.word(OFF_RING[ring].1)
    }

    fn head_flag(&self, ring: usize) -> &AtomicU64 {
        self.map.word(OFF_RING[ring].0 + WAITER_FLAG)
    }

    fn tail_flag(&self, ring: usize) -> &AtomicU64 {
        self.map.word(OFF_RING[ring].1 + WAITER_FLAG)
    }
}

/// Wake whoever sleeps on the index word `index` (its waiter flag is the next word).
fn wake(index: &AtomicU64, flag: &AtomicU64) {
    // Pairs with the fence in `wait_for`: either the waiter sees the new index, or we see
    // its flag.
    fence(Ordering::SeqCst);
    if flag.load(Ordering::Relaxed) != 0 {
        // SAFETY: FUTEX_WAKE on the address of a live, 4-byte aligned word of the shared
        // mapping (the low half of an 8-aligned AtomicU64); it only wakes waiters.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                index.as_ptr().cast::<u32>(),
                libc::FUTEX_WAKE,
                1,
                0usize,
                0usize,
                0u32,
            )
        };
    }
}

/// Wait until `ready(index)` holds for the index word `index`: poll for `spin`, then sleep
/// on its futex (flag raised); fail after [`PEER_TIMEOUT`] without progress.
fn wait_for(
    what: &str,
    spin: Duration,
    index: &AtomicU64,
    flag: &AtomicU64,
    ready: impl Fn(u64) -> bool,
) -> io::Result<()> {
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        if ready(index.load(Ordering::Acquire)) {
            return Ok(());
        }
        polls = polls.wrapping_add(1);
        // Reading the clock every 64 polls keeps the spin loop tight.
        if polls.is_multiple_of(64) && start.elapsed() >= spin {
            break;
        }
        std::hint::spin_loop();
    }
    loop {
        flag.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let seen = index.load(Ordering::Acquire);
        if ready(seen) {
            flag.store(0, Ordering::Relaxed);
            return Ok(());
        }
        let left = PEER_TIMEOUT.saturating_sub(start.elapsed());
        if left.is_zero() {
            flag.store(0, Ordering::Relaxed);
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("shm: peer idle while waiting for {what}"),
            ));
        }
        let ts = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on a live, 4-byte aligned word of the shared mapping with a
        // valid relative timeout; the kernel sleeps only while the word still holds `seen`
        // (its low 32 bits), so a wake between our check and the call is not lost.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                index.as_ptr().cast::<u32>(),
                libc::FUTEX_WAIT,
                seen as u32,
                &ts as *const libc::timespec,
                0usize,
                0u32,
            )
        };
        flag.store(0, Ordering::Relaxed);
    }
}

impl Channel for ShmChannel {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        if msg.len() > self.slot_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "message longer than a slot",
            ));
        }
        let ring = self.tx_ring;
        let head = self.tx_head;
        let slots = self.slots;
        // The consumer's tail is the other process's word: only compared, never used as
        // an offset, so a wild value can stall us but not make us write out of bounds.
        wait_for(
            "a free slot",
            self.spin,
            self.tail(ring),
            self.tail_flag(ring),
            |tail| head.wrapping_sub(tail) < slots,
        )?;
        let off = self.slot_offset(ring, head);
        // SAFETY: `off` is a slot of our transmit ring inside the mapping (the geometry was
        // checked against the mapping length), the slot's header and payload hold
        // `LINE + slot_len` bytes and `msg` is no longer than `slot_len`. The consumer does
        // not touch this slot until the release store of `head` below.
        unsafe {
            let slot = self.map.ptr.as_ptr().add(off);
            slot.cast::<u64>().write_volatile(msg.len() as u64);
            std::ptr::copy_nonoverlapping(msg.as_ptr(), slot.add(LINE), msg.len());
        }
        self.tx_head = head.wrapping_add(1);
        self.head(ring).store(self.tx_head, Ordering::Release);
        wake(self.head(ring), self.head_flag(ring));
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let ring = self.rx_ring;
        let tail = self.rx_tail;
        wait_for(
            "a message",
            self.spin,
            self.head(ring),
            self.head_flag(ring),
            |head| head != tail,
        )?;
        let off = self.slot_offset(ring, tail);
        // SAFETY: `off` is a slot of our receive ring inside the mapping; the producer
        // published it with a release store of `head` that our acquire load observed, and
        // will not reuse it before our release store of `tail`.
        let len = unsafe { self.map.ptr.as_ptr().add(off).cast::<u64>().read_volatile() };
        // The length comes from the other process: check it before copying.
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= self.slot_len && l <= buf.len())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("shm: message of {len} bytes does not fit"),
                )
            })?;
        // SAFETY: as above; `len` was checked against the slot capacity and `buf`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.ptr.as_ptr().add(off + LINE),
                buf.as_mut_ptr(),
                len,
            );
        }
        self.rx_tail = tail.wrapping_add(1);
        self.tail(ring).store(self.rx_tail, Ordering::Release);
        wake(self.tail(ring), self.tail_flag(ring));
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::exchange::{
        pingpong_client, pingpong_server, stream_receiver, stream_sender,
    };

    const SPIN: Duration = Duration::from_micros(5);

    #[test]
    fn messages_cross_in_order_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring");
        let mut server = ShmChannel::create(&path, 100, 3, SPIN).unwrap();
        let mut client = ShmChannel::open(&path, SPIN).unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 100];
            for i in 0..50u8 {
                let n = server.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], &vec![i; usize::from(i)][..]);
            }
            server.send(b"done").unwrap();
        });
        for i in 0..50u8 {
            client.send(&vec![i; usize::from(i)]).unwrap();
        }
        let mut buf = [0u8; 8];
        assert_eq!(client.recv(&mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"done");
        t.join().unwrap();
    }

    #[test]
    fn oversized_and_bad_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring");
        let mut server = ShmChannel::create(&path, 8, 2, SPIN).unwrap();
        assert_eq!(
            server.send(&[0; 9]).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // A second server on the same file is refused: the file must be fresh.
        assert!(ShmChannel::create(&path, 8, 2, SPIN).is_err());

        let bogus = dir.path().join("bogus");
        std::fs::write(&bogus, vec![0u8; CONTROL_LEN]).unwrap();
        assert_eq!(
            ShmChannel::open(&bogus, SPIN).err().unwrap().kind(),
            io::ErrorKind::InvalidData
        );
        // A geometry that claims more than the file holds.
        let mut page = vec![0u8; CONTROL_LEN];
        page[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        page[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        page[16..24].copy_from_slice(&4u64.to_le_bytes());
        std::fs::write(&bogus, &page).unwrap();
        assert_eq!(
            ShmChannel::open(&bogus, SPIN).err().unwrap().kind(),
            io::ErrorKind::InvalidData
        );
        std::fs::write(&bogus, b"short").unwrap();
        assert!(ShmChannel::open(&bogus, SPIN).is_err());
    }

    #[test]
    fn a_length_beyond_the_slot_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring");
        let _server = ShmChannel::create(&path, 16, 2, SPIN).unwrap();
        let mut client = ShmChannel::open(&path, SPIN).unwrap();
        let mut evil = ShmChannel::open(&path, SPIN).unwrap();
        // Pretend to be the server: publish a slot on ring 1 with a wild length.
        evil.tx_ring = 1;
        evil.send(&[1; 16]).unwrap();
        let off = evil.slot_offset(1, 0);
        // SAFETY: slot 0 of ring 1 lies inside the test's mapping.
        unsafe {
            evil.map
                .ptr
                .as_ptr()
                .add(off)
                .cast::<u64>()
                .write_volatile(1 << 50)
        };
        let mut buf = [0u8; 16];
        assert_eq!(
            client.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn exchange_loops_over_shared_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring");
        let mut server = ShmChannel::create(&path, 4096, slots_for(4096), SPIN).unwrap();
        let mut client = ShmChannel::open(&path, SPIN).unwrap();
        let t = std::thread::spawn(move || {
            pingpong_server(&mut server, 4096, 2, 20).unwrap();
            stream_receiver(&mut server, 4096, 2, 100).unwrap()
        });
        let pp = pingpong_client(&mut client, 4096, 2, 20).unwrap();
        stream_sender(&mut client, 4096, 2, 100).unwrap();
        let st = t.join().unwrap();
        assert_eq!(pp.round_trips_ns.len(), 20);
        assert_eq!((st.messages, st.bytes), (100, 409_600));
    }
}
