//! Decoding one request, running it, and queueing its reply and watch events.
//!
//! Ordering follows xenstored: a change's watch events are queued before the reply
//! that acknowledges it; a new watch's first event comes right after the
//! acknowledgement.

use std::sync::Arc;

use xmx_hv::xs::wire::{self, Header, MsgType, XsErrno, XsFrame, DOMID_SELF, PAYLOAD_MAX};
use xmx_hv::{DomId, DOM0};

use super::conn::{Outstanding, XsConnId};
use super::ops::{self, Limits};
use super::path::{self, Canonical};
use super::perms;
use super::state::XenstoredState;
use super::store::{Store, Transaction, Tree};
use super::watch::{NodeChange, Watch};
use super::XenstoreQuotas;

/// What a successful request produced.
struct Done {
    reply: Vec<u8>,
    /// Changes to announce before the reply.
    events: Vec<NodeChange>,
    /// A watch event for the requesting connection, queued after the reply.
    first_event: Option<(Vec<u8>, bool)>,
}

impl Done {
    fn reply(reply: Vec<u8>) -> Done {
        Done {
            reply,
            events: Vec::new(),
            first_event: None,
        }
    }

    fn ok() -> Done {
        Done::reply(wire::OK_PAYLOAD.to_vec())
    }
}

type XsOutcome = Result<Done, XsErrno>;

fn invalid(_: wire::WireError) -> XsErrno {
    XsErrno::Einval
}

/// Run one request from connection `conn_id` and queue what it produced.
pub(crate) fn process(
    st: &mut XenstoredState,
    quotas: &XenstoreQuotas,
    outstanding: &Outstanding,
    conn_id: XsConnId,
    frame: XsFrame,
) {
    let Some(io) = st.conns.get(&conn_id).map(|c| Arc::clone(&c.io)) else {
        return;
    };
    let header = frame.header;
    let outcome = handle(
        st,
        quotas,
        outstanding,
        conn_id,
        io.domid,
        &header,
        &frame.payload,
    );
    tracing::trace!(
        conn = conn_id,
        domid = io.domid,
        msg_type = header.msg_type,
        req_id = header.req_id,
        tx_id = header.tx_id,
        ok = outcome.is_ok(),
        "request"
    );
    let done = match outcome {
        Ok(done) => done,
        Err(e) => {
            io.push_reply(XsFrame::error_reply(&header, e).encode(), outstanding);
            return;
        }
    };
    st.fire(&done.events);
    let reply = if done.reply.len() > PAYLOAD_MAX {
        XsFrame::error_reply(&header, XsErrno::E2big)
    } else {
        XsFrame {
            header: Header {
                len: done.reply.len() as u32,
                ..header
            },
            payload: done.reply,
        }
    };
    io.push_reply(reply.encode(), outstanding);
    if let Some((event, special)) = done.first_event {
        io.push_event(event, special);
    }
}

fn limits(quotas: &XenstoreQuotas) -> Limits {
    Limits {
        nodes: quotas.nodes,
        value_size: quotas.value_size,
    }
}

fn handle(
    st: &mut XenstoredState,
    quotas: &XenstoreQuotas,
    outstanding: &Outstanding,
    conn_id: XsConnId,
    domid: DomId,
    header: &Header,
    payload: &[u8],
) -> XsOutcome {
    let Some(kind) = header.kind() else {
        tracing::debug!(domid, msg_type = header.msg_type, "unknown request type");
        return Err(XsErrno::Enosys);
    };
    let privileged_only = matches!(
        kind,
        MsgType::Control
            | MsgType::Introduce
            | MsgType::Release
            | MsgType::IsDomainIntroduced
            | MsgType::Resume
            | MsgType::SetTarget
            | MsgType::SetFeature
            | MsgType::GetQuota
            | MsgType::SetQuota
    );
    if privileged_only && !perms::privileged(domid) {
        return Err(XsErrno::Eacces);
    }
    // Watches ignore the transaction id; everything else names an open one or none.
    let uses_tx = !matches!(kind, MsgType::Watch | MsgType::Unwatch);
    let tx_id = if uses_tx { header.tx_id } else { 0 };
    if tx_id != 0 {
        let open = st
            .conns
            .get(&conn_id)
            .is_some_and(|c| c.transactions.contains_key(&tx_id));
        if !open {
            return Err(XsErrno::Enoent);
        }
    }
    let limits = limits(quotas);
    match kind {
        MsgType::Read => {
            let name = name_arg(domid, payload, false)?;
            let value = in_tree(st, conn_id, tx_id, |t| ops::read(t, domid, &name.path))?;
            Ok(Done::reply(value))
        }
        MsgType::Write => {
            let (fields, value) = wire::split_prefix_strings(payload, 1).map_err(invalid)?;
            let raw = fields.first().ok_or(XsErrno::Einval)?;
            let name = path::canonicalize(domid, raw, false)?;
            let events = in_tree(st, conn_id, tx_id, |t| {
                ops::write(t, domid, &limits, &name.path, value)
            })?;
            changed(st, conn_id, tx_id, events)
        }
        MsgType::Mkdir => {
            let name = name_arg(domid, payload, false)?;
            let events = in_tree(st, conn_id, tx_id, |t| {
                ops::mkdir(t, domid, &limits, &name.path)
            })?;
            changed(st, conn_id, tx_id, events)
        }
        MsgType::Rm => {
            let name = name_arg(domid, payload, false)?;
            let events = in_tree(st, conn_id, tx_id, |t| ops::rm(t, domid, &name.path))?;
            changed(st, conn_id, tx_id, events)
        }
        MsgType::Directory => {
            let name = name_arg(domid, payload, false)?;
            let children = in_tree(st, conn_id, tx_id, |t| ops::directory(t, domid, &name.path))?;
            Ok(Done::reply(wire::join_strings(&children)))
        }
        MsgType::DirectoryPart => {
            let fields = wire::split_strings(payload).map_err(invalid)?;
            let [raw, offset] = fields.as_slice() else {
                return Err(XsErrno::Einval);
            };
            let name = path::canonicalize(domid, raw, false)?;
            let offset = wire::parse_u32(offset).map_err(invalid)? as usize;
            let reply = in_tree(st, conn_id, tx_id, |t| {
                ops::directory_part(t, domid, &name.path, offset)
            })?;
            Ok(Done::reply(reply))
        }
        MsgType::GetPerms => {
            let name = name_arg(domid, payload, true)?;
            let acl = in_tree(st, conn_id, tx_id, |t| ops::get_perms(t, domid, &name.path))?;
            let strings: Vec<String> = acl.iter().map(wire::format_perm).collect();
            Ok(Done::reply(wire::join_strings(&strings)))
        }
        MsgType::SetPerms => {
            let fields = wire::split_strings(payload).map_err(invalid)?;
            let Some((raw, acl)) = fields.split_first() else {
                return Err(XsErrno::Einval);
            };
            if acl.is_empty() {
                return Err(XsErrno::Einval);
            }
            let name = path::canonicalize(domid, raw, true)?;
            let acl = wire::parse_perms(acl).map_err(invalid)?;
            let events = in_tree(st, conn_id, tx_id, |t| {
                ops::set_perms(t, domid, &name.path, &acl)
            })?;
            changed(st, conn_id, tx_id, events)
        }
        MsgType::Watch => watch(st, quotas, conn_id, domid, payload),
        MsgType::Unwatch => {
            let (name, token) = watch_args(domid, payload)?;
            let conn = st.conns.get_mut(&conn_id).ok_or(XsErrno::Eio)?;
            let at = conn
                .watches
                .iter()
                .position(|w| w.path == name.path && w.token == token)
                .ok_or(XsErrno::Enoent)?;
            conn.watches.remove(at);
            Ok(Done::ok())
        }
        MsgType::TransactionStart => {
            if tx_id != 0 {
                return Err(XsErrno::Ebusy);
            }
            if !perms::privileged(domid) && st.transactions_of(domid) >= quotas.transactions {
                return Err(XsErrno::Enospc);
            }
            let conn = st.conns.get_mut(&conn_id).ok_or(XsErrno::Eio)?;
            let id = conn.alloc_tx_id();
            conn.transactions.insert(id, Transaction::default());
            Ok(Done::reply(wire::join_strings(&[id.to_string()])))
        }
        MsgType::TransactionEnd => {
            let commit = match wire::one_string(payload).map_err(invalid)? {
                "T" => true,
                "F" => false,
                _ => return Err(XsErrno::Einval),
            };
            let conn = st.conns.get_mut(&conn_id).ok_or(XsErrno::Eio)?;
            let tx = conn.transactions.remove(&tx_id).ok_or(XsErrno::Enoent)?;
            if !commit {
                return Ok(Done::ok());
            }
            let events = tx.commit(&mut st.store)?;
            Ok(Done {
                events,
                ..Done::ok()
            })
        }
        MsgType::GetDomainPath => {
            let target = domid_arg(payload)?;
            Ok(Done::reply(wire::join_strings(&[path::home(target)])))
        }
        MsgType::IsDomainIntroduced => {
            let target = domid_arg(payload)?;
            let yes = target == DOMID_SELF || st.introduced.contains(&target);
            Ok(Done::reply(wire::join_strings(&[if yes {
                "T"
            } else {
                "F"
            }])))
        }
        MsgType::Introduce => {
            let fields = wire::split_strings(payload).map_err(invalid)?;
            let [target, _mfn, port, ..] = fields.as_slice() else {
                return Err(XsErrno::Einval);
            };
            let target = wire::parse_domid(target).map_err(invalid)?;
            let port = wire::parse_u32(port).map_err(invalid)?;
            if target == DOM0 || target >= DOMID_SELF || port == 0 {
                return Err(XsErrno::Einval);
            }
            st.introduce(target);
            Ok(Done::ok())
        }
        MsgType::Release => {
            let target = domid_arg(payload)?;
            if target == DOM0 || target >= DOMID_SELF {
                return Err(XsErrno::Einval);
            }
            if !st.introduced.contains(&target) {
                return Err(XsErrno::Enoent);
            }
            st.release(target, outstanding);
            Ok(Done::ok())
        }
        MsgType::Resume => {
            let target = domid_arg(payload)?;
            if target == DOM0 || target >= DOMID_SELF {
                return Err(XsErrno::Einval);
            }
            if !st.introduced.contains(&target) {
                return Err(XsErrno::Enoent);
            }
            Ok(Done::ok())
        }
        MsgType::ResetWatches => {
            let conn = st.conns.get_mut(&conn_id).ok_or(XsErrno::Eio)?;
            conn.watches.clear();
            conn.transactions.clear();
            Ok(Done::ok())
        }
        MsgType::Control
        | MsgType::SetTarget
        | MsgType::GetFeature
        | MsgType::SetFeature
        | MsgType::GetQuota
        | MsgType::SetQuota
        | MsgType::WatchEvent
        | MsgType::Error => Err(XsErrno::Enosys),
    }
}

/// The single name argument of READ, MKDIR, RM, DIRECTORY, GET_PERMS.
fn name_arg(domid: DomId, payload: &[u8], allow_special: bool) -> Result<Canonical, XsErrno> {
    let raw = wire::one_string(payload).map_err(invalid)?;
    path::canonicalize(domid, raw, allow_special)
}

fn domid_arg(payload: &[u8]) -> Result<DomId, XsErrno> {
    wire::parse_domid(wire::one_string(payload).map_err(invalid)?).map_err(invalid)
}

/// `path\0token\0` of WATCH and UNWATCH (a trailing empty reserved field is tolerated).
fn watch_args(domid: DomId, payload: &[u8]) -> Result<(Canonical, String), XsErrno> {
    let fields = wire::split_strings(payload).map_err(invalid)?;
    let (raw, token) = match fields.as_slice() {
        [raw, token] | [raw, token, ""] => (*raw, *token),
        _ => return Err(XsErrno::Einval),
    };
    Ok((path::canonicalize(domid, raw, true)?, token.to_string()))
}

fn watch(
    st: &mut XenstoredState,
    quotas: &XenstoreQuotas,
    conn_id: XsConnId,
    domid: DomId,
    payload: &[u8],
) -> XsOutcome {
    let (name, token) = watch_args(domid, payload)?;
    let watches = st.watches_of(domid);
    let conn = st.conns.get_mut(&conn_id).ok_or(XsErrno::Eio)?;
    if conn
        .watches
        .iter()
        .any(|w| w.path == name.path && w.token == token)
    {
        return Err(XsErrno::Eexist);
    }
    if !perms::privileged(domid) && watches >= quotas.watches {
        return Err(XsErrno::Enospc);
    }
    let watch = Watch {
        path: name.path,
        token,
        relative_prefix: name.relative_prefix,
    };
    // Fired once at once, whatever the caller may read: it only echoes the name given.
    let first = watch
        .event_frame(&watch.path)
        .map(|f| (f, watch.path.starts_with('@')));
    conn.watches.push(watch);
    Ok(Done {
        first_event: first,
        ..Done::ok()
    })
}

/// Run `op` on the committed tree or on the open transaction `tx_id`.
fn in_tree<R>(
    st: &mut XenstoredState,
    conn_id: XsConnId,
    tx_id: u32,
    op: impl FnOnce(&mut dyn Tree) -> Result<R, XsErrno>,
) -> Result<R, XsErrno> {
    let XenstoredState { store, conns, .. } = st;
    if tx_id == 0 {
        return op(store as &mut Store);
    }
    let tx = conns
        .get_mut(&conn_id)
        .and_then(|c| c.transactions.get_mut(&tx_id))
        .ok_or(XsErrno::Enoent)?;
    let mut view = tx.view(store);
    op(&mut view)
}

/// Acknowledge a change: its events fire now, or on commit if it was transactional.
fn changed(
    st: &mut XenstoredState,
    conn_id: XsConnId,
    tx_id: u32,
    events: Vec<NodeChange>,
) -> XsOutcome {
    if tx_id == 0 {
        return Ok(Done {
            events,
            ..Done::ok()
        });
    }
    if let Some(tx) = st
        .conns
        .get_mut(&conn_id)
        .and_then(|c| c.transactions.get_mut(&tx_id))
    {
        tx.events.extend(events);
    }
    Ok(Done::ok())
}
