//! The hypervisor's half of a migration: sending a domain's memory and grant table in
//! rounds (source host), and receiving them into an incoming domain (destination host).
//! The stream format is in [`super::stream`]; the rounds are driven by
//! [`xmx_hv::sim::migrate`].
//!
//! What moves, as on Xen: the memory (frame `f` of the source is frame `f` of the
//! destination) and the grant-table entries in use (same refs, same frames, same
//! granted-to domid, flags without the mapping status bits). What does not: event
//! channels, and mappings held by others (they stay with the source domain and are
//! released when it is destroyed); grants ended by their owner while still mapped
//! ([`Owner::Released`]) die with the source. Restored grants are held by the domain
//! ([`Owner::Restored`]), since the connections that made them are on the source host,
//! until a process of the domain takes them over (`GrantAdopt` on `hv.sock`), as the
//! process that made them does once it re-attaches to this host; on Xen the guest's
//! kernel keeps them across the migration and its processes notice nothing.
//!
//! Dirty pages: the simulated platform has no dirty logging (processes write the memory
//! file through their own mappings, the daemon sees nothing), so each round reads every
//! frame of the extent and compares it with what earlier rounds sent, kept per frame on
//! the source while the domain is being sent; a frame never sent counts as zero, which is
//! what the destination has there. Only frames that differ are written. The copy costs
//! as much memory as the non-zero part of the domain, for the time of the migration, and
//! is exact (a hash could let a changed page through). Rounds read and write frames with
//! the host's lock released: it guards the control path of every domain of the host, and
//! a round of a large domain takes long.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use xmx_hv::sim::admin::{Restored, RunState, SaveInfo, SaveRound};
use xmx_hv::sim::proto::SimResponse;
use xmx_hv::{DomId, Error, GrantRef, Result, DOM0, PAGE_SIZE};

use super::mem::read_fully_at;
use super::stream::{GrantRecord, StreamReader, StreamRecord, StreamWriter};
use super::table::{GTF_PERMIT_ACCESS, GTF_READONLY, GTF_TYPE_MASK};
use super::{entry_flags, no_fds, Grant, Hv, HvConnId, HvDomain, HvState, Owner};
use crate::config::SimhvConfig;

/// What the destination holds of a domain being sent: the frames sent so far, non-zero.
type Sent = HashMap<u32, Box<[u8]>>;

/// A domain being sent to another host.
pub(super) struct OutgoingMigration {
    /// Tells this sending from a later one, for a round that ends after `save_end`.
    id: u64,
    /// None while a round runs (with the host's lock released).
    sent: Option<Sent>,
}

/// A domain receiving a migration stream.
#[derive(Default)]
pub(super) struct Incoming {
    /// A restore runs (with the host's lock released).
    busy: bool,
}

/// What a stream applied to the memory file, before its grants are installed.
struct Applied {
    extent: u32,
    frames: u32,
    grants: Option<Vec<GrantRecord>>,
}

impl Hv {
    /// Start sending `domid`.
    pub(crate) fn save_begin(&self, domid: DomId) -> Result<SaveInfo> {
        if domid == DOM0 {
            return Err(Error::Invalid("dom0 does not migrate".into()));
        }
        let mut st = self.lock();
        let id = st.next_handle;
        st.next_handle += 1;
        let dom = st
            .domains
            .get_mut(&domid)
            .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
        if dom.incoming.is_some() {
            return Err(Error::Invalid(format!(
                "domain {domid} is still receiving a migration"
            )));
        }
        if dom.outgoing.is_some() {
            return Err(Error::Busy(format!("domain {domid} is being sent already")));
        }
        dom.outgoing = Some(OutgoingMigration {
            id,
            sent: Some(HashMap::new()),
        });
        tracing::info!(domid, name = %dom.name, "sending the domain");
        Ok(SaveInfo {
            name: dom.name.clone(),
            mem_limit: dom.mem.limit_bytes(),
            frames: dom.mem.extent(),
            grants: dom.grants.len(),
        })
    }

    /// Stop sending `domid`.
    pub(crate) fn save_end(&self, domid: DomId) -> Result<()> {
        let mut st = self.lock();
        let dom = st
            .domains
            .get_mut(&domid)
            .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
        if dom.outgoing.take().is_none() {
            return Err(Error::Invalid(format!("domain {domid} is not being sent")));
        }
        Ok(())
    }

    /// Write one round of `domid`'s stream to a new file at `path`. A failed round ends
    /// the sending: what the destination holds is no longer known.
    pub(crate) fn save_round(&self, domid: DomId, path: &Path, last: bool) -> Result<SaveRound> {
        let (round, mut sent) = {
            let mut st = self.lock();
            let dom = st
                .domains
                .get_mut(&domid)
                .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
            if last && dom.run != RunState::Suspended {
                return Err(Error::Invalid(format!(
                    "the last round needs domain {domid} suspended"
                )));
            }
            let mem = dom.mem.clone_file()?;
            let out = dom.outgoing.as_mut().ok_or_else(|| {
                Error::Invalid(format!(
                    "domain {domid} is not being sent (save_begin first)"
                ))
            })?;
            let sent = out
                .sent
                .take()
                .ok_or_else(|| Error::Busy(format!("a round of domain {domid} is being saved")))?;
            let round = RoundSource {
                id: out.id,
                instance: dom.instance,
                mem,
                extent: dom.mem.extent(),
                limit_frames: dom.mem.limit_frames(),
                grants: last.then(|| dom.grant_records()),
                still_mapped: dom.grants.values().filter(|g| g.maps > 0).count(),
            };
            (round, sent)
        };
        let result = round.write(path, &mut sent);
        let mut st = self.lock();
        if let Some(dom) = st.domains.get_mut(&domid) {
            let ours = dom.instance == round.instance
                && dom.outgoing.as_ref().is_some_and(|o| o.id == round.id);
            if ours {
                match &result {
                    Ok(_) => {
                        if let Some(o) = dom.outgoing.as_mut() {
                            o.sent = Some(sent);
                        }
                    }
                    Err(_) => dom.outgoing = None,
                }
            }
        }
        if let Ok(r) = &result {
            tracing::info!(
                domid,
                last,
                scanned = r.frames_scanned,
                sent = r.frames_sent,
                grants = r.grants_sent,
                bytes = r.bytes,
                "migration round saved"
            );
            if r.grants_still_mapped > 0 {
                tracing::warn!(
                    domid,
                    grants = r.grants_still_mapped,
                    "grants still mapped by another domain at the last round; \
                     those mappings stay on this host"
                );
            }
        }
        result
    }

    /// Apply the stream at `path` to the incoming domain `domid`. A stream with grants
    /// is the last one: it completes the domain, which may then be resumed. A failed
    /// restore may have written some frames already: the migration is off, and the
    /// incoming domain is to be destroyed.
    pub(crate) fn restore(&self, domid: DomId, path: &Path) -> Result<Restored> {
        let (mem, limit_frames, entries, instance) = {
            let mut st = self.lock();
            let dom = st
                .domains
                .get_mut(&domid)
                .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
            let mem = dom.mem.clone_file()?;
            let (limit, entries, instance) =
                (dom.mem.limit_frames(), dom.table.entries(), dom.instance);
            let inc = dom.incoming.as_mut().ok_or_else(|| {
                Error::Invalid(format!(
                    "domain {domid} is not an incoming domain (create it with incoming)"
                ))
            })?;
            if inc.busy {
                return Err(Error::Busy(format!(
                    "a stream is being restored into domain {domid}"
                )));
            }
            inc.busy = true;
            (mem, limit, entries, instance)
        };
        let applied = apply(path, &mem, limit_frames, entries as usize);
        let mut st = self.lock();
        let cfg = &self.config;
        let dom = match st.domains.get_mut(&domid) {
            Some(d) if d.instance == instance => d,
            _ => return Err(Error::Closed(format!("domain {domid} was destroyed"))),
        };
        if let Some(inc) = dom.incoming.as_mut() {
            inc.busy = false;
        }
        let applied = applied?;
        dom.mem.note_restored(applied.extent)?;
        let mut restored = Restored {
            frames: applied.frames,
            grants: 0,
            complete: false,
        };
        if let Some(grants) = applied.grants {
            dom.restore_grants(cfg, domid, &grants)?;
            dom.incoming = None;
            restored.grants = grants.len();
            restored.complete = true;
        }
        tracing::info!(
            domid,
            frames = restored.frames,
            grants = restored.grants,
            complete = restored.complete,
            "migration stream restored"
        );
        Ok(restored)
    }
}

impl HvState {
    /// Make `conn` the owner of restored grants of its domain `domid`, all or nothing.
    pub(super) fn grant_adopt(
        &mut self,
        conn: HvConnId,
        domid: DomId,
        remote: DomId,
        writable: bool,
        refs: &[GrantRef],
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        if refs.is_empty() {
            return Err(Error::Invalid("adopting zero grants".into()));
        }
        // Allowed while suspended, as teardown is: it only changes who may end the grants.
        let dom = self.domain_mut(domid)?;
        let mut seen = HashSet::with_capacity(refs.len());
        let mut grants = Vec::with_capacity(refs.len());
        for &r in refs {
            if !seen.insert(r) {
                return Err(Error::Invalid(format!("grant ref {r} listed twice")));
            }
            let g = match dom.grants.get(&r) {
                Some(g) if g.owner == Owner::Restored => g,
                _ => {
                    return Err(Error::NotFound(format!(
                        "grant ref {r} of domain {domid} is not a restored grant left to adopt"
                    )))
                }
            };
            let entry = dom.table.read(r)?;
            if entry.domid != remote || g.readonly == writable {
                return Err(Error::Invalid(format!(
                    "grant ref {r} grants domain {} {} access, not domain {remote} {} access",
                    entry.domid,
                    if g.readonly { "read-only" } else { "writable" },
                    if writable { "writable" } else { "read-only" },
                )));
            }
            grants.push((r, g.frame));
        }
        for &r in refs {
            if let Some(g) = dom.grants.get_mut(&r) {
                g.owner = Owner::Conn(conn);
            }
        }
        tracing::debug!(domid, remote, count = refs.len(), "restored grants adopted");
        no_fds(SimResponse::Granted { grants })
    }
}

/// What a save round reads, taken under the host's lock.
struct RoundSource {
    id: u64,
    instance: u64,
    mem: File,
    extent: u32,
    limit_frames: u32,
    grants: Option<Vec<GrantRecord>>,
    still_mapped: usize,
}

impl RoundSource {
    fn write(&self, path: &Path, sent: &mut Sent) -> Result<SaveRound> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => {
                    Error::Exists(format!("stream file {} exists", path.display()))
                }
                _ => Error::Io(io::Error::new(
                    e.kind(),
                    format!("creating stream file {}: {e}", path.display()),
                )),
            })?;
        let written = self.write_to(file, &self.mem, sent);
        if written.is_err() {
            let _ = std::fs::remove_file(path);
        }
        written
    }

    fn write_to(&self, file: File, mem: &File, sent: &mut Sent) -> Result<SaveRound> {
        let mut w = StreamWriter::new(file)?;
        w.memory(self.extent, self.limit_frames)?;
        let mut page = vec![0u8; PAGE_SIZE];
        let mut frames_sent = 0;
        for frame in 0..self.extent {
            read_fully_at(mem, &mut page, frame as u64 * PAGE_SIZE as u64)?;
            let zero = page.iter().all(|b| *b == 0);
            let changed = match sent.get(&frame) {
                Some(before) => before[..] != page[..],
                None => !zero,
            };
            if !changed {
                continue;
            }
            w.page(frame, &page)?;
            frames_sent += 1;
            if zero {
                sent.remove(&frame);
            } else {
                match sent.get_mut(&frame) {
                    Some(before) => before.copy_from_slice(&page),
                    None => {
                        sent.insert(frame, page.clone().into_boxed_slice());
                    }
                }
            }
        }
        let grants_sent = match &self.grants {
            Some(g) => {
                w.grants(g)?;
                g.len()
            }
            None => 0,
        };
        let bytes = w.end()?;
        Ok(SaveRound {
            frames_scanned: self.extent,
            frames_sent,
            grants_sent,
            grants_still_mapped: if self.grants.is_some() {
                self.still_mapped
            } else {
                0
            },
            bytes,
        })
    }
}

/// Read the stream at `path` and write its pages into `mem`; returns what it held.
fn apply(path: &Path, mem: &File, limit_frames: u32, max_grants: usize) -> Result<Applied> {
    let file = File::open(path).map_err(|e| {
        Error::Io(io::Error::new(
            e.kind(),
            format!("opening stream file {}: {e}", path.display()),
        ))
    })?;
    let mut r = StreamReader::new(file, max_grants)?;
    let extent = match r.next()? {
        StreamRecord::Memory {
            extent,
            limit_frames: source_limit,
        } => {
            if extent > limit_frames {
                return Err(Error::Quota(format!(
                    "the stream covers {extent} frames, the domain's limit is {limit_frames} \
                     (the source's was {source_limit})"
                )));
            }
            extent
        }
        _ => {
            return Err(Error::Invalid(
                "migration stream: it does not start with MEMORY".into(),
            ))
        }
    };
    let mut applied = Applied {
        extent,
        frames: 0,
        grants: None,
    };
    loop {
        match r.next()? {
            StreamRecord::Page { frame } => {
                if frame >= extent {
                    return Err(Error::Invalid(format!(
                        "migration stream: frame {frame} beyond its extent of {extent}"
                    )));
                }
                if applied.grants.is_some() {
                    return Err(Error::Invalid(
                        "migration stream: a page after the grants".into(),
                    ));
                }
                mem.write_all_at(r.page(), frame as u64 * PAGE_SIZE as u64)?;
                applied.frames += 1;
            }
            StreamRecord::Grants(g) => {
                if applied.grants.is_some() {
                    return Err(Error::Invalid("migration stream: GRANTS twice".into()));
                }
                applied.grants = Some(g);
            }
            StreamRecord::Memory { .. } => {
                return Err(Error::Invalid("migration stream: MEMORY twice".into()))
            }
            StreamRecord::End => return Ok(applied),
        }
    }
}

impl HvDomain {
    /// The grant entries to send: those in use, but not those released by their owner
    /// while mapped (they end with the source domain).
    fn grant_records(&self) -> Vec<GrantRecord> {
        let mut out: Vec<GrantRecord> = self
            .grants
            .iter()
            .filter(|(_, g)| g.owner != Owner::Released)
            .filter_map(|(&r, g)| match self.table.read(r) {
                Ok(entry) => Some(GrantRecord {
                    gref: r,
                    frame: g.frame,
                    domid: entry.domid,
                    flags: GTF_PERMIT_ACCESS | if g.readonly { GTF_READONLY } else { 0 },
                }),
                Err(e) => {
                    tracing::error!(gref = r, error = %e, "a grant without its entry is not sent");
                    None
                }
            })
            .collect();
        out.sort_by_key(|g| g.gref);
        out
    }

    /// Install the grants of a last stream into this incoming domain, all or nothing.
    fn restore_grants(
        &mut self,
        cfg: &SimhvConfig,
        me: DomId,
        grants: &[GrantRecord],
    ) -> Result<()> {
        if !self.grants.is_empty() {
            return Err(Error::Invalid(format!(
                "domain {me} has grants already; restoring into it would mix two domains"
            )));
        }
        if grants.len() > cfg.max_grants {
            return Err(Error::Quota(format!(
                "{} grants restored, the quota is {}",
                grants.len(),
                cfg.max_grants
            )));
        }
        let mut refs = BTreeSet::new();
        let mut frames = BTreeSet::new();
        for g in grants {
            if g.flags & GTF_TYPE_MASK != GTF_PERMIT_ACCESS {
                return Err(Error::Invalid(format!(
                    "restored grant ref {} is not a permit-access entry (flags {:#x})",
                    g.gref, g.flags
                )));
            }
            if !refs.insert(g.gref) {
                return Err(Error::Invalid(format!(
                    "grant ref {} restored twice",
                    g.gref
                )));
            }
            if !frames.insert(g.frame) {
                return Err(Error::Invalid(format!(
                    "frame {} is granted twice in the stream",
                    g.frame
                )));
            }
        }
        let extent = self.mem.extent();
        if let Some(&last) = frames.last().filter(|&&f| f >= extent) {
            return Err(Error::Invalid(format!(
                "a restored grant names frame {last}, beyond the {extent} frames restored"
            )));
        }
        // Refs first: it checks every ref and changes nothing on a refusal; then nothing
        // below can be refused.
        self.table
            .adopt_refs(&refs)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        self.mem.adopt(&frames)?;
        for g in grants {
            let grant = Grant {
                frame: g.frame,
                readonly: g.flags & GTF_READONLY != 0,
                owner: Owner::Restored,
                maps: 0,
                maps_rw: 0,
            };
            self.table
                .install(g.gref, g.domid, g.frame, entry_flags(&grant))?;
            self.grants.insert(g.gref, grant);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A host with one incoming domain (1) in `dir`.
    fn incoming(dir: &Path) -> Hv {
        let hv = Hv::new(SimhvConfig {
            gnttab_entries: 64,
            ..SimhvConfig::default()
        });
        std::fs::create_dir(xmx_hv::sim::layout::dom_dir(dir, 1)).unwrap();
        hv.add_domain(dir, 1, "in", Some(16 * PAGE_SIZE as u64), true)
            .unwrap();
        hv
    }

    fn stream(dir: &Path, name: &str, extent: u32, grants: &[GrantRecord]) -> PathBuf {
        let path = dir.join(name);
        let mut w = StreamWriter::new(File::create(&path).unwrap()).unwrap();
        w.memory(extent, 16).unwrap();
        for f in 0..extent {
            w.page(f, &[f as u8 + 1; PAGE_SIZE]).unwrap();
        }
        w.grants(grants).unwrap();
        w.end().unwrap();
        path
    }

    fn grant(gref: GrantRef, frame: u32) -> GrantRecord {
        GrantRecord {
            gref,
            frame,
            domid: DOM0,
            flags: GTF_PERMIT_ACCESS,
        }
    }

    #[test]
    fn restored_grants_are_checked_before_anything_is_installed() {
        let dir = tempfile::tempdir().unwrap();
        let hv = incoming(dir.path());
        let refused = [
            ("twice", vec![grant(8, 0), grant(8, 1)]),
            ("same-frame", vec![grant(8, 0), grant(9, 0)]),
            ("reserved", vec![grant(3, 0)]),
            ("beyond-table", vec![grant(64, 0)]),
            ("beyond-extent", vec![grant(8, 4)]),
            (
                "not-permit",
                vec![GrantRecord {
                    flags: 2,
                    ..grant(8, 0)
                }],
            ),
        ];
        for (name, grants) in refused {
            let path = stream(dir.path(), name, 4, &grants);
            match hv.restore(1, &path) {
                Err(Error::Invalid(_)) => {}
                other => panic!("{name}: {other:?}"),
            }
            let c = hv.counters(1).unwrap();
            assert_eq!(
                (c.grants_active, c.mem_pages, c.run),
                (0, 0, RunState::Suspended)
            );
        }
        let path = stream(dir.path(), "good", 4, &[grant(9, 2), grant(12, 3)]);
        let r = hv.restore(1, &path).unwrap();
        assert_eq!((r.frames, r.grants, r.complete), (4, 2, true));
        let c = hv.counters(1).unwrap();
        assert_eq!((c.grants_active, c.mem_pages), (2, 2));
        // Complete: no more streams, and it may run.
        assert!(matches!(hv.restore(1, &path), Err(Error::Invalid(_))));
        hv.set_run(1, RunState::Running).unwrap();
    }

    #[test]
    fn a_stream_beyond_the_memory_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let hv = incoming(dir.path());
        let path = stream(dir.path(), "big", 17, &[]);
        assert!(matches!(hv.restore(1, &path), Err(Error::Quota(_))));
    }
}
