//! What a copy out of shared memory costs, by length: [`SharedMem::read_bytes`] (the ring
//! and window path, one `rep movsb` on x86-64 from 64 bytes), the relaxed 8-byte atomic
//! loop it replaced, and the C library's memcpy between private buffers (the ceiling).
//!
//! Run: `cargo bench -p xmx-wire --bench shared_copy -- --warm-up-time 1 --measurement-time 3`.

use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{BenchmarkId, Criterion, Throughput};
use xmx_wire::ring::{SharedMem, PAGE_SIZE};

/// The relaxed word loop, as the baseline: whole words, aligned source.
fn word_loop(mem: &SharedMem, dst: &mut [u8]) {
    for (w, chunk) in dst.chunks_exact_mut(8).enumerate() {
        // SAFETY: the benchmark's lengths are multiples of 8 within the region, whose base
        // is page-aligned; the region lives as long as `mem`.
        let cell = unsafe { AtomicU64::from_ptr(mem.as_ptr().add(8 * w).cast::<u64>()) };
        chunk.copy_from_slice(&cell.load(Ordering::Relaxed).to_ne_bytes());
    }
}

fn copies(c: &mut Criterion) {
    let mut group = c.benchmark_group("copy_out");
    for len in [4096usize, 9000 / 8 * 8, 256 << 10, 16 << 20] {
        let mem = SharedMem::new_owned(len.div_ceil(PAGE_SIZE));
        let private = vec![7u8; len];
        let mut dst = vec![0u8; len];
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_with_input(BenchmarkId::new("read_bytes", len), &len, |b, _| {
            b.iter(|| assert!(mem.read_bytes(0, &mut dst)))
        });
        group.bench_with_input(BenchmarkId::new("relaxed_words", len), &len, |b, _| {
            b.iter(|| word_loop(&mem, &mut dst))
        });
        group.bench_with_input(BenchmarkId::new("memcpy_private", len), &len, |b, _| {
            b.iter(|| dst.copy_from_slice(std::hint::black_box(&private)))
        });
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    copies(&mut c);
    c.final_summary();
}
