//! The grant table of a simulated domain, as granter (like gntalloc) and as mapper
//! (like gntdev).
//!
//! Granted pages are frames of the domain's own memory file, mapped here with the
//! descriptor received at `Hello`. Foreign grants are frames of the remote's memory file,
//! whose descriptor the daemon sends with the first mapping of that remote (per domain
//! instance and access mode) and which is cached here afterwards.
//!
//! # Following a migration
//!
//! A domain moved to another host (see [`super::migrate`]) finds its grants restored
//! there under the same refs and frames, but owned by nobody. [`SimGrantTable::follow`]
//! connects the handle to the destination's daemon, adopts every grant the handle still
//! holds and maps the destination's frames over the same addresses, so every pointer
//! into the pages stays valid and every [`GrantedPages`] keeps working. Foreign grants
//! this handle mapped stay mapped from the old host: they belong to other domains there.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::conn::HvConn;
use super::mmap::Region;
use super::proto::{
    error_from_code, CopySide, CopySpec, SimRequest, SimResponse, MAX_COPY_SEGMENTS,
};
use crate::handoff::{PagesLayout, PagesSource};
use crate::{
    CopyPtr, CopySegment, DomId, Error, GrantRef, GrantTable, GrantedOwner, GrantedPages,
    MappedOwner, MappedPages, Result, PAGE_SIZE,
};

/// The grant table of one attached domain; grants made through it end when it and every
/// [`GrantedPages`] it returned are gone.
pub struct SimGrantTable {
    conn: Arc<HvConn>,
    table_size: AtomicUsize,
    instance: AtomicU64,
    own_mem: Arc<MemSlot>,
    remote_mem: Mutex<HashMap<(u64, bool), Arc<OwnedFd>>>,
    live: Arc<LiveGrants>,
}

/// The domain's memory file, replaced when the domain moved.
struct MemSlot(Mutex<Arc<OwnedFd>>);

impl MemSlot {
    fn get(&self) -> Arc<OwnedFd> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, fd: OwnedFd) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(fd);
    }
}

/// The grants a handle holds, for [`SimGrantTable::follow`].
#[derive(Default)]
struct LiveGrants {
    next: AtomicU64,
    grants: Mutex<BTreeMap<u64, LiveGrant>>,
}

#[derive(Clone)]
struct LiveGrant {
    region: Weak<Region>,
    refs: Vec<GrantRef>,
    frames: Vec<u32>,
    remote: DomId,
    writable: bool,
}

impl LiveGrants {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, LiveGrant>> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, grant: LiveGrant) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, grant);
        id
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }
}

impl SimGrantTable {
    /// Open a grant-table connection for `domid` of the simhv at `dir`.
    pub fn open(dir: &Path, domid: DomId) -> Result<SimGrantTable> {
        let conn = HvConn::connect(dir, domid)?;
        let (resp, fds) = conn.call(&SimRequest::Hello)?;
        let SimResponse::Hello {
            domid: got,
            instance,
            table_size,
        } = resp
        else {
            return Err(Error::Protocol("unexpected reply to hello".into()));
        };
        if got != domid {
            return Err(Error::Protocol(format!(
                "hv.sock of domain {domid} answered as domain {got}"
            )));
        }
        let own_mem = fds
            .into_iter()
            .next()
            .ok_or_else(|| Error::Protocol("hello reply without the memory descriptor".into()))?;
        Ok(SimGrantTable {
            conn: Arc::new(conn),
            table_size: AtomicUsize::new(table_size as usize),
            instance: AtomicU64::new(instance),
            own_mem: Arc::new(MemSlot(Mutex::new(Arc::new(own_mem)))),
            remote_mem: Mutex::new(HashMap::new()),
            live: Arc::new(LiveGrants::default()),
        })
    }

    /// The domain moved to domain `domid` of the simhv at `dir` (see the module docs):
    /// talk to that daemon from now on, adopt every grant this handle holds and map the
    /// destination's frames at the addresses the pages have. Returns how many grants
    /// were adopted. On an error the handle is unusable for new grants (its existing
    /// mappings stay valid).
    pub fn follow(&self, dir: &Path, domid: DomId) -> Result<usize> {
        self.conn.reconnect(dir, domid)?;
        let (resp, fds) = self.conn.call(&SimRequest::Hello)?;
        let SimResponse::Hello {
            domid: got,
            instance,
            table_size,
        } = resp
        else {
            return Err(Error::Protocol("unexpected reply to hello".into()));
        };
        if got != domid {
            return Err(Error::Protocol(format!(
                "hv.sock of domain {domid} answered as domain {got}"
            )));
        }
        let mem = fds
            .into_iter()
            .next()
            .ok_or_else(|| Error::Protocol("hello reply without the memory descriptor".into()))?;
        let live: Vec<LiveGrant> = self.live.lock().values().cloned().collect();
        let mut adopted = 0;
        for g in live {
            // Ended meanwhile: nothing to follow.
            let Some(region) = g.region.upgrade() else {
                continue;
            };
            let (resp, _) = self.conn.call(&SimRequest::GrantAdopt {
                remote: g.remote,
                writable: g.writable,
                refs: g.refs.clone(),
            })?;
            let SimResponse::Granted { grants } = resp else {
                return Err(Error::Protocol("unexpected reply to adopt".into()));
            };
            let frames: Vec<u32> = grants.iter().map(|x| x.1).collect();
            if frames != g.frames || grants.iter().zip(&g.refs).any(|(x, r)| x.0 != *r) {
                return Err(Error::Protocol(
                    "the destination restored the grants over other frames".into(),
                ));
            }
            region.remap_frames(mem.as_fd(), &frames, true)?;
            adopted += g.refs.len();
        }
        self.own_mem.set(mem);
        self.instance.store(instance, Ordering::Release);
        self.table_size
            .store(table_size as usize, Ordering::Release);
        // Remote instances name domains of the old host.
        self.remote_mem
            .lock()
            .map_err(|_| Error::Closed("grant table poisoned".into()))?
            .clear();
        tracing::info!(domid, dir = %dir.display(), grants = adopted, "grant table followed the domain");
        Ok(adopted)
    }

    /// The pages of `refs` (at `frames`), mapped in `region`, as this handle's grants.
    fn granted(
        &self,
        region: Region,
        refs: Vec<GrantRef>,
        frames: Vec<u32>,
        remote: DomId,
        writable: bool,
    ) -> GrantedPages {
        let region = Arc::new(region);
        let live_id = self.live.add(LiveGrant {
            region: Arc::downgrade(&region),
            refs: refs.clone(),
            frames: frames.clone(),
            remote,
            writable,
        });
        GrantedPages {
            ptr: region.as_ptr(),
            len: region.len(),
            refs,
            remote,
            writable,
            owner: Some(Box::new(SimGrantedOwner {
                conn: self.conn.clone(),
                region: Some(region),
                mem: self.own_mem.clone(),
                frames,
                live: self.live.clone(),
                live_id,
            })),
        }
    }

    /// The calling domain.
    pub fn domid(&self) -> DomId {
        self.conn.domid()
    }

    /// The domain's memory, as this handle maps it.
    pub(crate) fn memory(&self) -> Arc<OwnedFd> {
        self.own_mem.get()
    }

    /// The daemon's id for this incarnation of the domain (changes if the domid is reused).
    pub fn instance(&self) -> u64 {
        self.instance.load(Ordering::Acquire)
    }

    /// Take over grants of this domain that a migration restored (see the simhv's
    /// migration): they become this handle's, as if granted through it, and are mapped
    /// here anew. `remote` and `writable` must be what the grants say. If mapping them
    /// fails they stay this handle's and end when it closes.
    pub fn adopt(&self, remote: DomId, refs: &[GrantRef], writable: bool) -> Result<GrantedPages> {
        if refs.is_empty() {
            return Err(Error::Invalid("adopting zero grants".into()));
        }
        let (resp, _) = self.conn.call(&SimRequest::GrantAdopt {
            remote,
            writable,
            refs: refs.to_vec(),
        })?;
        let SimResponse::Granted { grants } = resp else {
            return Err(Error::Protocol("unexpected reply to adopt".into()));
        };
        if grants.len() != refs.len() || grants.iter().zip(refs).any(|(g, r)| g.0 != *r) {
            return Err(Error::Protocol(
                "daemon adopted other grants than asked".into(),
            ));
        }
        let frames: Vec<u32> = grants.iter().map(|g| g.1).collect();
        let region = Region::map_frames(self.own_mem.get().as_fd(), &frames, true)?;
        Ok(self.granted(region, refs.to_vec(), frames, remote, writable))
    }

    fn remote_fd(
        &self,
        instance: u64,
        writable: bool,
        attached: Vec<OwnedFd>,
    ) -> Result<Arc<OwnedFd>> {
        let mut cache = self
            .remote_mem
            .lock()
            .map_err(|_| Error::Closed("grant table poisoned".into()))?;
        if let Some(fd) = attached.into_iter().next() {
            let fd = Arc::new(fd);
            cache.insert((instance, writable), fd.clone());
            return Ok(fd);
        }
        cache.get(&(instance, writable)).cloned().ok_or_else(|| {
            Error::Protocol("mapping reply without the remote memory descriptor".into())
        })
    }
}

impl GrantTable for SimGrantTable {
    fn grant_pages(&self, remote: DomId, count: usize, writable: bool) -> Result<GrantedPages> {
        if count == 0 {
            return Err(Error::Invalid("granting zero pages".into()));
        }
        let count32 = u32::try_from(count)
            .map_err(|_| Error::Quota(format!("{count} pages in one grant")))?;
        let (resp, _) = self.conn.call(&SimRequest::GrantAlloc {
            remote,
            writable,
            count: count32,
        })?;
        let SimResponse::Granted { grants } = resp else {
            return Err(Error::Protocol("unexpected reply to grant".into()));
        };
        let refs: Vec<GrantRef> = grants.iter().map(|g| g.0).collect();
        let frames: Vec<u32> = grants.iter().map(|g| g.1).collect();
        if refs.len() != count {
            let _ = self.conn.call(&SimRequest::GrantEnd { defer: true, refs });
            return Err(Error::Protocol(
                "daemon granted a different page count".into(),
            ));
        }
        let region = match Region::map_frames(self.own_mem.get().as_fd(), &frames, true) {
            Ok(r) => r,
            Err(e) => {
                let _ = self.conn.call(&SimRequest::GrantEnd { defer: true, refs });
                return Err(Error::Io(e));
            }
        };
        Ok(self.granted(region, refs, frames, remote, writable))
    }

    fn map(&self, remote: DomId, refs: &[GrantRef], writable: bool) -> Result<MappedPages> {
        if refs.is_empty() {
            return Err(Error::Invalid("mapping zero grants".into()));
        }
        let (resp, fds) = self.conn.call(&SimRequest::Map {
            remote,
            writable,
            refs: refs.to_vec(),
        })?;
        let SimResponse::Mapped {
            handle,
            instance,
            frames,
        } = resp
        else {
            return Err(Error::Protocol("unexpected reply to map".into()));
        };
        let unmap = |e: Error| {
            let _ = self.conn.call(&SimRequest::Unmap { handle });
            e
        };
        if frames.len() != refs.len() {
            return Err(unmap(Error::Protocol(
                "daemon mapped a different page count".into(),
            )));
        }
        let fd = self.remote_fd(instance, writable, fds).map_err(unmap)?;
        let region =
            Region::map_frames(fd.as_fd(), &frames, writable).map_err(|e| unmap(Error::Io(e)))?;
        Ok(MappedPages {
            ptr: region.as_ptr(),
            len: region.len(),
            remote,
            refs: refs.to_vec(),
            writable,
            owner: Some(Box::new(SimMappedOwner {
                conn: self.conn.clone(),
                handle,
                region: Some(region),
            })),
        })
    }

    fn copy(&self, segments: &[CopySegment]) -> Result<Vec<Result<()>>> {
        if segments.len() > MAX_COPY_SEGMENTS {
            return Err(Error::Invalid(format!(
                "{} copy segments (at most {MAX_COPY_SEGMENTS})",
                segments.len()
            )));
        }
        let mut specs = Vec::with_capacity(segments.len());
        let mut data = Vec::new();
        for s in segments {
            if s.len as usize > PAGE_SIZE {
                return Err(Error::Invalid(format!("copy segment of {} bytes", s.len)));
            }
            let source = match s.source {
                CopyPtr::Local(p) => {
                    if p.is_null() && s.len > 0 {
                        return Err(Error::Invalid("null local copy source".into()));
                    }
                    if s.len > 0 {
                        // SAFETY: CopyPtr::Local is, by the GrantTable::copy contract,
                        // local memory of the caller valid for `len` bytes; it is only read.
                        let bytes = unsafe { std::slice::from_raw_parts(p, s.len as usize) };
                        data.extend_from_slice(bytes);
                    }
                    CopySide::Local
                }
                CopyPtr::Foreign {
                    domid,
                    gref,
                    offset,
                } => CopySide::Foreign {
                    domid,
                    gref,
                    offset,
                },
            };
            let dest = match s.dest {
                CopyPtr::Local(p) => {
                    if p.is_null() && s.len > 0 {
                        return Err(Error::Invalid("null local copy destination".into()));
                    }
                    CopySide::Local
                }
                CopyPtr::Foreign {
                    domid,
                    gref,
                    offset,
                } => CopySide::Foreign {
                    domid,
                    gref,
                    offset,
                },
            };
            specs.push(CopySpec {
                source,
                dest,
                len: s.len,
            });
        }
        let (resp, _) = self.conn.call(&SimRequest::Copy {
            segments: specs,
            data,
        })?;
        let SimResponse::Copied { status, data } = resp else {
            return Err(Error::Protocol("unexpected reply to copy".into()));
        };
        if status.len() != segments.len() {
            return Err(Error::Protocol(
                "copy reply with a wrong segment count".into(),
            ));
        }
        let local_dest_bytes: usize = segments
            .iter()
            .filter(|s| matches!(s.dest, CopyPtr::Local(_)))
            .map(|s| s.len as usize)
            .sum();
        if data.len() != local_dest_bytes {
            return Err(Error::Protocol(
                "copy reply with a wrong data length".into(),
            ));
        }
        let mut at = 0usize;
        let mut results = Vec::with_capacity(segments.len());
        for (s, code) in segments.iter().zip(status) {
            if let CopyPtr::Local(p) = s.dest {
                let len = s.len as usize;
                let chunk = &data[at..at + len];
                at += len;
                if code == 0 && len > 0 {
                    // SAFETY: CopyPtr::Local is, by the GrantTable::copy contract, local
                    // memory of the caller valid for `len` bytes of writing.
                    unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), p, len) };
                }
            }
            results.push(if code == 0 {
                Ok(())
            } else {
                Err(error_from_code(code, "grant copy segment failed".into()))
            });
        }
        Ok(results)
    }

    fn table_size(&self) -> usize {
        self.table_size.load(Ordering::Acquire)
    }
}

/// Ends the grants of one [`GrantedPages`] and unmaps them locally.
struct SimGrantedOwner {
    conn: Arc<HvConn>,
    region: Option<Arc<Region>>,
    /// The domain's memory file and the frames of the pages, for exports.
    mem: Arc<MemSlot>,
    frames: Vec<u32>,
    /// Its entry among the handle's live grants.
    live: Arc<LiveGrants>,
    live_id: u64,
}

impl GrantedOwner for SimGrantedOwner {
    fn end_access(&mut self, refs: &[GrantRef]) -> Result<()> {
        self.conn.call(&SimRequest::GrantEnd {
            defer: false,
            refs: refs.to_vec(),
        })?;
        self.live.remove(self.live_id);
        self.region = None;
        Ok(())
    }

    fn release(&mut self, refs: &[GrantRef]) {
        self.live.remove(self.live_id);
        self.region = None;
        if refs.is_empty() {
            return;
        }
        if let Err(e) = self.conn.call(&SimRequest::GrantEnd {
            defer: true,
            refs: refs.to_vec(),
        }) {
            tracing::debug!(error = %e, "releasing grants");
        }
    }

    fn export(&self) -> Result<PagesSource> {
        if self.region.is_none() {
            return Err(Error::Closed("the grants were ended".into()));
        }
        Ok(PagesSource {
            fd: crate::handoff::dup(self.mem.get().as_fd())?,
            layout: PagesLayout::SimFrames {
                frames: self.frames.clone(),
            },
        })
    }
}

/// Unmaps one [`MappedPages`]: locally first, then tells the daemon.
struct SimMappedOwner {
    conn: Arc<HvConn>,
    handle: u64,
    region: Option<Region>,
}

impl MappedOwner for SimMappedOwner {
    fn unmap(&mut self) {
        self.region = None;
        match self.conn.call(&SimRequest::Unmap {
            handle: self.handle,
        }) {
            Ok(_) | Err(Error::NotFound(_)) | Err(Error::Closed(_)) => {}
            Err(e) => tracing::warn!(error = %e, handle = self.handle, "unmapping grants"),
        }
    }
}
