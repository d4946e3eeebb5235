//! Locking as every xmx thread does it.

use std::sync::{Mutex, MutexGuard};

/// The guard of `m`, also after a panic on another thread poisoned it. Every critical
/// section in xmx leaves its data consistent before anything that can panic, so the data is
/// still sound; and a daemon, or an application linked with the library, must not die of a
/// panic it did not have.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
