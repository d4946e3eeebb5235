//! The library's process-wide state, from `mx_init` to `mx_finalize`: the
//! settings, the transport, the open endpoints and the background
//! progression thread.
//!
//! MX progresses in the background: acks, connect replies, retransmissions
//! and pulls happen while the application computes, so a process may even
//! talk between two of its own endpoints from a single thread. The thread
//! here sleeps until an endpoint's doorbell rings with no application thread
//! waiting on it, or until the earliest protocol timer; it skips endpoints
//! whose progression is disabled and never blocks on an endpoint another
//! thread is using.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::abi::{MxReturn, MX_API};
use crate::doorbell::Unattended;
use crate::endpoint::{AppEndpoint, StallView};
use crate::errors::{Failure, MxResult};
use crate::raw::RawEndpoint;
use crate::settings::Settings;
use crate::transport::Transport;

/// The origin of the protocol core's clock.
pub(crate) fn origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// The current time for the protocol core.
pub(crate) fn now() -> xmx_mx::Instant {
    xmx_mx::Instant::from_nanos(origin().elapsed().as_nanos() as u64)
}

/// A core instant as a wall-clock instant.
pub(crate) fn to_std(t: xmx_mx::Instant) -> std::time::Instant {
    origin() + Duration::from_nanos(t.as_nanos())
}

/// The initialized library.
pub(crate) struct Library {
    /// Settings read at init.
    pub(crate) settings: Settings,
    /// The transport every endpoint uses.
    pub(crate) transport: Arc<dyn Transport>,
    endpoints: RwLock<FxHashMap<u32, Arc<AppEndpoint>>>,
    raws: Mutex<FxHashMap<u32, Arc<RawEndpoint>>>,
    next_handle: AtomicU32,
    background: Arc<Background>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The stall watch's thread, when `XMX_STALL_REPORT_MS` asks for one.
    stall_watch: Mutex<Option<JoinHandle<()>>>,
    /// Set at finalize: the stall watch ends.
    stall_watch_stop: Arc<(Mutex<bool>, Condvar)>,
}

static LIBRARY: RwLock<Option<Arc<Library>>> = RwLock::new(None);

fn tracing_init(verbose: Option<u32>, stall_report: bool) {
    let filter = match (std::env::var("RUST_LOG").ok(), verbose) {
        (Some(f), _) => f,
        // A stall report asked for is shown even when nothing else is.
        (None, Some(0)) | (None, None) if stall_report => "warn".into(),
        (None, Some(0)) | (None, None) => return,
        (None, Some(1)) => "info".into(),
        (None, Some(2)) => "debug".into(),
        (None, Some(_)) => "trace".into(),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}

/// `mx__init_api`: checks the application's API version, reads the
/// environment and opens the transport.
pub(crate) fn init(api: c_int) -> MxResult<()> {
    let mut slot = LIBRARY.write().unwrap_or_else(|e| e.into_inner());
    let settings = Settings::from_lookup(|k| std::env::var(k).ok())
        .map_err(|e| Failure::new(MxReturn::BadParamVal, e))?;
    tracing_init(settings.verbose, settings.stall_report.is_some());
    crate::errors::set_default(settings.errors_are_fatal);
    if slot.is_some() {
        return Err(Failure::new(
            MxReturn::AlreadyInitialized,
            "initializing the library",
        ));
    }
    if api == 0 || api >> 8 != MX_API >> 8 {
        return Err(Failure::new(
            MxReturn::BadLibVersion,
            format!(
                "application built for MX API {:#x}, this library provides {:#x}",
                api, MX_API
            ),
        ));
    }
    let transport = crate::transport::select(&settings)?;
    tracing::info!(transport = transport.name(), "MX library initialized");
    let _ = origin();
    *slot = Some(Arc::new(Library {
        settings,
        transport,
        endpoints: RwLock::new(FxHashMap::default()),
        raws: Mutex::new(FxHashMap::default()),
        next_handle: AtomicU32::new(1),
        background: Arc::new(Background::default()),
        thread: Mutex::new(None),
        stall_watch: Mutex::new(None),
        stall_watch_stop: Arc::default(),
    }));
    Ok(())
}

/// `mx_finalize`: closes every endpoint and stops the background thread.
/// A library not initialized (or finalized already) is `MX_NOT_INITIALIZED`.
pub(crate) fn finalize() -> MxResult<()> {
    let lib = LIBRARY.write().unwrap_or_else(|e| e.into_inner()).take();
    let Some(lib) = lib else {
        return Err(Failure::new(
            MxReturn::NotInitialized,
            "the library is not initialized",
        ));
    };
    let eps: Vec<Arc<AppEndpoint>> = lib
        .endpoints
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .drain()
        .map(|(_, e)| e)
        .collect();
    for ep in eps {
        ep.close();
    }
    lib.raws.lock().unwrap_or_else(|e| e.into_inner()).clear();
    lib.background.stop();
    let t = lib.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(t) = t {
        let _ = t.join();
    }
    {
        let (stop, cond) = &*lib.stall_watch_stop;
        *stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cond.notify_all();
    }
    let w = lib
        .stall_watch
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(w) = w {
        let _ = w.join();
    }
    Ok(())
}

/// The library, if initialized.
pub(crate) fn library() -> MxResult<Arc<Library>> {
    with_library(Arc::clone)
}

/// `f` of the library under its read lock, if initialized: no reference to it is taken.
fn with_library<R>(f: impl FnOnce(&Arc<Library>) -> R) -> MxResult<R> {
    let lib = LIBRARY.read().unwrap_or_else(|e| e.into_inner());
    let lib = lib
        .as_ref()
        .ok_or_else(|| Failure::new(MxReturn::NotInitialized, "the library is not initialized"))?;
    Ok(f(lib))
}

/// The open endpoint behind an `mx_endpoint_t` (never dereferenced: it is a
/// handle number).
pub(crate) fn endpoint(handle: usize) -> MxResult<Arc<AppEndpoint>> {
    // Every MX call on an endpoint starts here: the endpoint is looked up
    // under the library's read lock, without a reference to the library
    // (whose count two more atomic read-modify-writes per call moved).
    let found = with_library(|lib| {
        u32::try_from(handle)
            .ok()
            .and_then(|h| lib.endpoint_by_handle(h))
    })?;
    found.ok_or_else(|| {
        Failure::new(
            MxReturn::BadEndpoint,
            format!("{handle:#x} is not an open endpoint"),
        )
    })
}

impl Library {
    /// Looks an endpoint up by handle.
    pub(crate) fn endpoint_by_handle(&self, handle: u32) -> Option<Arc<AppEndpoint>> {
        self.endpoints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&handle)
            .cloned()
    }

    /// Every open endpoint.
    pub(crate) fn endpoints(&self) -> Vec<Arc<AppEndpoint>> {
        self.endpoints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// A fresh handle (24 bits, never 0, not in use).
    pub(crate) fn new_handle(&self) -> u32 {
        let eps = self.endpoints.read().unwrap_or_else(|e| e.into_inner());
        let raws = self.raws.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let h = self.next_handle.fetch_add(1, Ordering::Relaxed)
                & ((1 << crate::addr::LOCAL_HANDLE_BITS) - 1);
            if h != 0 && !eps.contains_key(&h) && !raws.contains_key(&h) {
                return h;
            }
        }
    }

    /// What rings when an endpoint's doorbell rings unattended.
    pub(crate) fn background(&self) -> Arc<Background> {
        self.background.clone()
    }

    /// Registers an opened endpoint and makes sure the background thread runs.
    pub(crate) fn add_endpoint(self: &Arc<Self>, ep: Arc<AppEndpoint>) {
        self.endpoints
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ep.handle(), ep);
        let mut t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if t.is_none() {
            let bg = self.background.clone();
            let me = Arc::downgrade(self);
            *t = std::thread::Builder::new()
                .name("mx-progress".into())
                .spawn(move || bg.run(me))
                .map_err(|e| tracing::warn!(%e, "no background progression thread"))
                .ok();
        }
        drop(t);
        if let Some(after) = self.settings.stall_report {
            let mut w = self.stall_watch.lock().unwrap_or_else(|e| e.into_inner());
            if w.is_none() {
                let stop = self.stall_watch_stop.clone();
                let me = Arc::downgrade(self);
                *w = std::thread::Builder::new()
                    .name("mx-stall-watch".into())
                    .spawn(move || watch_stalls(&stop, me, after))
                    .map_err(|e| tracing::warn!(%e, "no stall watch"))
                    .ok();
            }
        }
    }

    /// Unregisters a closed endpoint; returns it if it was open.
    pub(crate) fn remove_endpoint(&self, handle: u32) -> Option<Arc<AppEndpoint>> {
        self.endpoints
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle)
    }

    /// Registers a raw endpoint.
    pub(crate) fn add_raw(&self, raw: Arc<RawEndpoint>) {
        self.raws
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(raw.handle(), raw);
    }

    /// A raw endpoint by handle.
    pub(crate) fn raw(&self, handle: usize) -> MxResult<Arc<RawEndpoint>> {
        let found = u32::try_from(handle).ok().and_then(|h| {
            self.raws
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&h)
                .cloned()
        });
        found.ok_or_else(|| {
            Failure::new(
                MxReturn::BadEndpoint,
                format!("{handle:#x} is not an open raw endpoint"),
            )
        })
    }

    /// Unregisters a raw endpoint.
    pub(crate) fn remove_raw(&self, handle: usize) -> Option<Arc<RawEndpoint>> {
        let h = u32::try_from(handle).ok()?;
        self.raws
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&h)
    }
}

/// The stall watch: every quarter of `after`, each endpoint with requests
/// pending is checked for completions; one that has had none for `after`
/// has its state logged as a warning, once until it completes something
/// again. It only reads: a stall it reports goes on as before.
fn watch_stalls(stop: &(Mutex<bool>, Condvar), lib: std::sync::Weak<Library>, after: Duration) {
    // Per endpoint handle: completions last seen, since when, reported.
    let mut seen: FxHashMap<u32, (u64, std::time::Instant, bool)> = FxHashMap::default();
    let tick = (after / 4).max(Duration::from_millis(10));
    loop {
        {
            let (flag, cond) = stop;
            let s = flag.lock().unwrap_or_else(|e| e.into_inner());
            let (s, _) = cond
                .wait_timeout_while(s, tick, |stopped| !*stopped)
                .unwrap_or_else(|e| e.into_inner());
            if *s {
                return;
            }
        }
        let Some(lib) = lib.upgrade() else { return };
        let now = std::time::Instant::now();
        let eps = lib.endpoints();
        seen.retain(|h, _| eps.iter().any(|e| e.handle() == *h));
        for ep in eps {
            let entry = seen.entry(ep.handle()).or_insert((0, now, false));
            match ep.stall_view() {
                StallView::Locked => {
                    if now.duration_since(entry.1) >= after && !entry.2 {
                        entry.2 = true;
                        tracing::warn!(
                            handle = ep.handle(),
                            "stall: the endpoint's lock has been held for a second at least"
                        );
                    }
                }
                StallView::Seen {
                    completed,
                    pending,
                    text,
                } => {
                    if completed != entry.0 || pending == 0 {
                        *entry = (completed, now, false);
                    } else if now.duration_since(entry.1) >= after && !entry.2 {
                        entry.2 = true;
                        tracing::warn!(
                            handle = ep.handle(),
                            pending,
                            "stall: no request completed for {} ms\n{text}",
                            now.duration_since(entry.1).as_millis()
                        );
                    }
                }
            }
        }
    }
}

#[derive(Default)]
struct BackgroundState {
    rung: FxHashSet<u64>,
    stop: bool,
}

/// The background progression thread's inbox.
#[derive(Default)]
pub(crate) struct Background {
    state: Mutex<BackgroundState>,
    cond: Condvar,
    /// When the thread plans to wake for timers (core nanos; MAX: never).
    wake_at: AtomicU64,
    stopped: AtomicBool,
}

impl Unattended for Background {
    fn rang(&self, token: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.rung.insert(token);
        self.cond.notify_one();
    }

    fn deferred(&self, until: u64) {
        // The endpoint reports `until` in its next deadline while the ring
        // stays deferred, so the scan finds it due then.
        self.nudge(xmx_mx::Instant::from_nanos(until));
    }
}

impl Background {
    /// An endpoint has a timer at `deadline`: wake earlier if needed.
    pub(crate) fn nudge(&self, deadline: xmx_mx::Instant) {
        if deadline.as_nanos() < self.wake_at.load(Ordering::SeqCst) {
            let _s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            self.wake_at.store(deadline.as_nanos(), Ordering::SeqCst);
            self.cond.notify_one();
        }
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.stop = true;
        self.cond.notify_all();
    }

    fn run(&self, lib: std::sync::Weak<Library>) {
        let mut busy: Vec<u32> = Vec::new();
        loop {
            let rung = {
                let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if s.stop {
                        return;
                    }
                    if !s.rung.is_empty() {
                        break;
                    }
                    if !busy.is_empty() {
                        // An endpoint was in use: look again shortly. Before the
                        // deadline test: the busy endpoint's own timer is due, and its
                        // user serves it, so testing it first would rescan at once, in
                        // a loop, for as long as the application holds the endpoint.
                        let r = self
                            .cond
                            .wait_timeout(s, Duration::from_micros(200))
                            .unwrap_or_else(|e| e.into_inner());
                        s = r.0;
                        break;
                    }
                    let at = self.wake_at.load(Ordering::SeqCst);
                    let now_ns = now().as_nanos();
                    if at <= now_ns {
                        break;
                    }
                    s = if at == u64::MAX {
                        self.cond.wait(s).unwrap_or_else(|e| e.into_inner())
                    } else {
                        self.cond
                            .wait_timeout(s, Duration::from_nanos(at - now_ns))
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    };
                }
                std::mem::take(&mut s.rung)
            };
            let Some(lib) = lib.upgrade() else { return };
            // Timers armed during the scan lower this again (see nudge).
            self.wake_at.store(u64::MAX, Ordering::SeqCst);
            let now_ns = now().as_nanos();
            let mut next = u64::MAX;
            let mut still_busy = Vec::new();
            for ep in lib.endpoints() {
                let due = ep.next_deadline().is_some_and(|t| t.as_nanos() <= now_ns);
                let wanted =
                    rung.contains(&(ep.handle() as u64)) || due || busy.contains(&ep.handle());
                if wanted && !ep.progression_disabled() && !ep.background_progress() {
                    still_busy.push(ep.handle());
                }
                if let Some(t) = ep.next_deadline() {
                    next = next.min(t.as_nanos());
                }
            }
            busy = still_busy;
            self.wake_at.fetch_min(next, Ordering::SeqCst);
            if self.stopped.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}
