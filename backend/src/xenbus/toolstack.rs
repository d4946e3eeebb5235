//! The toolstack's side of device `xmx`: creating and removing both halves of a device in
//! xenstore, as `xl` does for its devices.
//!
//! [`attach`] writes, in one transaction,
//!
//! ```text
//! /local/domain/<backend>/backend/xmx/<domU>/<devid>/   owner backend, domU may read
//!     frontend, frontend-id, mac, cluster, hostname, state = 1
//! /local/domain/<domU>/device/xmx/<devid>/              owner domU, backend may read
//!     backend, backend-id, state = 1
//! ```
//!
//! Keys are written after their directory's permissions are set, so they inherit them.
//! [`detach`] removes both directories in one transaction; the backend sees its directory
//! vanish and releases the guest.
//!
//! A migrated guest's device goes with it: [`DeviceRecord::read`] takes, on the source
//! host once the guest is suspended, its identity and the sessions its backend recorded
//! for its endpoints (`endpoint-sessions/<endpoint> = <session>`); [`attach_moved`]
//! creates the device on the destination with those sessions recorded, so the
//! endpoints the frontend re-opens there keep them and peers' messages in flight still
//! reach them.

use std::collections::BTreeMap;

use xmx_hv::{DomId, Error, Result, TxId, Xenstore, XsAccess, XsPerm};
use xmx_wire::mxoe::Mac;
use xmx_wire::xenbus::{self, keys, XenbusState};

/// Largest quality-of-service weight: a guest's share of the host's pull budget and
/// transmit queue is its weight over the sum of the active guests' weights.
pub const QOS_WEIGHT_MAX: u32 = 1000;

/// A weight as dom0 writes it: a decimal number from 1 to [`QOS_WEIGHT_MAX`].
pub fn parse_qos_weight(text: &str) -> Result<u32> {
    match text.trim().parse::<u32>() {
        Ok(w) if (1..=QOS_WEIGHT_MAX).contains(&w) => Ok(w),
        _ => Err(Error::Invalid(format!(
            "QoS weight {:?}: a number from 1 to {QOS_WEIGHT_MAX}",
            text.trim()
        ))),
    }
}

/// A device's QoS weight from its backend directory (1 if none was set).
pub fn read_qos_weight(xs: &dyn Xenstore, backend_dir: &str) -> Result<u32> {
    match xs.read(
        xmx_hv::XBT_NULL,
        &xenbus::key_path(backend_dir, keys::QOS_WEIGHT),
    ) {
        Ok(raw) => parse_qos_weight(String::from_utf8_lossy(&raw).trim_end_matches('\0')),
        Err(Error::NotFound(_)) => Ok(1),
        Err(e) => Err(e),
    }
}

/// Set the QoS weight of device `devid` of `domu`, served by backend domain `backend`
/// (the directory inherits its owner's permissions: the guest may only read it).
pub fn write_qos_weight(
    xs: &dyn Xenstore,
    backend: DomId,
    domu: DomId,
    devid: u32,
    weight: u32,
) -> Result<()> {
    parse_qos_weight(&weight.to_string())?;
    let bdir = xenbus::backend_dir(backend, domu, devid);
    in_transaction(xs, |tx| {
        if !exists(xs, tx, &bdir)? {
            return Err(Error::NotFound(bdir.clone()));
        }
        xs.write(
            tx,
            &xenbus::key_path(&bdir, keys::QOS_WEIGHT),
            weight.to_string().as_bytes(),
        )
    })
}

/// What dom0 decides about a guest's xmx device: never chosen by the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The guest's domain.
    pub domu: DomId,
    /// Device index within the guest (0 for the first).
    pub devid: u32,
    /// The guest's board MAC (unicast).
    pub mac: Mac,
    /// Its virtual cluster.
    pub cluster: u32,
    /// Its MX hostname (`host:board`), 1 to 79 bytes.
    pub hostname: String,
}

impl DeviceSpec {
    /// Refuse values the backend would refuse later.
    pub fn validate(&self) -> Result<()> {
        if !self.mac.is_unicast() {
            return Err(Error::Invalid(format!("MAC {} is not unicast", self.mac)));
        }
        if self.hostname.is_empty()
            || self.hostname.len() >= xmx_wire::mxoe::HOSTNAME_LEN_MAX
            || self.hostname.contains('\0')
        {
            return Err(Error::Invalid(
                "hostname must be 1 to 79 bytes without NUL".into(),
            ));
        }
        if self.devid > u32::from(u16::MAX) {
            return Err(Error::Invalid("device id must be below 65536".into()));
        }
        Ok(())
    }

    /// Read a device's parameters back from its backend directory; a device without a
    /// `hostname` key gets `default_hostname`.
    pub fn read(
        xs: &dyn Xenstore,
        backend_dir: &str,
        domu: DomId,
        devid: u32,
        default_hostname: &str,
    ) -> Result<Self> {
        let text = |key: &str| -> Result<String> {
            let raw = xs.read(xmx_hv::XBT_NULL, &xenbus::key_path(backend_dir, key))?;
            String::from_utf8(raw)
                .map(|s| s.trim_end_matches('\0').to_string())
                .map_err(|_| Error::Invalid(format!("{key} is not UTF-8")))
        };
        let mac: Mac = text(keys::MAC)?
            .trim()
            .parse()
            .map_err(|e| Error::Invalid(format!("mac: {e}")))?;
        let cluster = match text(keys::CLUSTER) {
            Ok(s) => xenbus::parse_u32(&s).map_err(|e| Error::Invalid(format!("cluster: {e}")))?,
            Err(Error::NotFound(_)) => 0,
            Err(e) => return Err(e),
        };
        let hostname = match text(keys::HOSTNAME) {
            Ok(s) => s,
            Err(Error::NotFound(_)) => default_hostname.to_string(),
            Err(e) => return Err(e),
        };
        let spec = DeviceSpec {
            domu,
            devid,
            mac,
            cluster,
            hostname,
        };
        spec.validate()?;
        Ok(spec)
    }
}

pub use xmx_hv::in_transaction;

fn exists(xs: &dyn Xenstore, tx: TxId, path: &str) -> Result<bool> {
    match xs.read(tx, path) {
        Ok(_) => Ok(true),
        Err(Error::NotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The sessions recorded in a device's backend directory, by endpoint; unreadable
/// entries are skipped (the endpoint then gets a new session).
pub fn read_sessions(xs: &dyn Xenstore, backend_dir: &str) -> BTreeMap<u8, u32> {
    let dir = xenbus::key_path(backend_dir, keys::ENDPOINT_SESSIONS);
    let Ok(entries) = xs.directory(xmx_hv::XBT_NULL, &dir) else {
        return BTreeMap::new();
    };
    entries
        .iter()
        .filter_map(|e| {
            let ep = e.parse::<u8>().ok()?;
            let raw = xs.read(xmx_hv::XBT_NULL, &xenbus::key_path(&dir, e)).ok()?;
            let text = String::from_utf8(raw).ok()?;
            let session = xenbus::parse_u32(text.trim_end_matches('\0')).ok()?;
            (session != 0).then_some((ep, session))
        })
        .collect()
}

/// What a migration carries of a guest's device to the destination host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRecord {
    /// Its identity (the domid is the source's).
    pub spec: DeviceSpec,
    /// The sessions of its endpoints, by endpoint.
    pub sessions: BTreeMap<u8, u32>,
}

impl DeviceRecord {
    /// Read device `devid` of `domu`, served by backend domain `backend`.
    pub fn read(xs: &dyn Xenstore, backend: DomId, domu: DomId, devid: u32) -> Result<Self> {
        let bdir = xenbus::backend_dir(backend, domu, devid);
        let spec = DeviceSpec::read(xs, &bdir, domu, devid, "")?;
        Ok(DeviceRecord {
            spec,
            sessions: read_sessions(xs, &bdir),
        })
    }
}

/// Create the device of `record` for guest `domu` (the migrated guest's new domid),
/// served by backend domain `backend`, with its endpoints' sessions recorded. If the
/// device exists already with the same identity (the new host's peer service may have
/// created it for a guest it saw arrive), the sessions are recorded in it; a device
/// with another identity is refused with [`Error::Exists`]. Call it before the guest's
/// frontend connects: the backend reads the sessions then.
pub fn attach_moved(
    xs: &dyn Xenstore,
    backend: DomId,
    domu: DomId,
    record: &DeviceRecord,
) -> Result<()> {
    let spec = DeviceSpec {
        domu,
        ..record.spec.clone()
    };
    match attach_with_sessions(xs, backend, &spec, &record.sessions) {
        Err(Error::Exists(dir)) => {
            let bdir = xenbus::backend_dir(backend, domu, spec.devid);
            match DeviceSpec::read(xs, &bdir, domu, spec.devid, "") {
                Ok(found) if found == spec => {}
                _ => return Err(Error::Exists(dir)),
            }
            let sessions = xenbus::key_path(&bdir, keys::ENDPOINT_SESSIONS);
            in_transaction(xs, |tx| {
                // Only into the device as it is: never re-create a removed directory.
                if !exists(xs, tx, &bdir)? {
                    return Err(Error::NotFound(bdir.clone()));
                }
                for (endpoint, session) in &record.sessions {
                    let node = xenbus::key_path(&sessions, &endpoint.to_string());
                    xs.write(tx, &node, session.to_string().as_bytes())?;
                }
                Ok(())
            })?;
            tracing::info!(
                domu,
                sessions = record.sessions.len(),
                "sessions recorded in the existing device"
            );
            Ok(())
        }
        other => other,
    }
}

/// Create both halves of device `spec` of a guest served by backend domain `backend`.
/// Refused with [`Error::Exists`] if either directory exists.
pub fn attach(xs: &dyn Xenstore, backend: DomId, spec: &DeviceSpec) -> Result<()> {
    attach_with_sessions(xs, backend, spec, &BTreeMap::new())
}

fn attach_with_sessions(
    xs: &dyn Xenstore,
    backend: DomId,
    spec: &DeviceSpec,
    sessions: &BTreeMap<u8, u32>,
) -> Result<()> {
    spec.validate()?;
    let bdir = xenbus::backend_dir(backend, spec.domu, spec.devid);
    let fdir = xenbus::frontend_dir(spec.domu, spec.devid);
    let initialising = XenbusState::Initialising.to_string();
    in_transaction(xs, |tx| {
        for dir in [&bdir, &fdir] {
            if exists(xs, tx, dir)? {
                return Err(Error::Exists(dir.clone()));
            }
        }
        xs.mkdir(tx, &bdir)?;
        xs.set_perms(
            tx,
            &bdir,
            &[
                XsPerm {
                    domid: backend,
                    access: XsAccess::None,
                },
                XsPerm {
                    domid: spec.domu,
                    access: XsAccess::Read,
                },
            ],
        )?;
        let put = |dir: &str, key: &str, value: &str| {
            xs.write(tx, &xenbus::key_path(dir, key), value.as_bytes())
        };
        put(&bdir, keys::FRONTEND, &fdir)?;
        put(&bdir, keys::FRONTEND_ID, &spec.domu.to_string())?;
        put(&bdir, keys::MAC, &spec.mac.to_string())?;
        put(&bdir, keys::CLUSTER, &spec.cluster.to_string())?;
        put(&bdir, keys::HOSTNAME, &spec.hostname)?;
        for (endpoint, session) in sessions {
            let dir = xenbus::key_path(&bdir, keys::ENDPOINT_SESSIONS);
            put(&dir, &endpoint.to_string(), &session.to_string())?;
        }
        put(&bdir, keys::STATE, &initialising)?;

        xs.mkdir(tx, &fdir)?;
        xs.set_perms(
            tx,
            &fdir,
            &[
                XsPerm {
                    domid: spec.domu,
                    access: XsAccess::None,
                },
                XsPerm {
                    domid: backend,
                    access: XsAccess::Read,
                },
            ],
        )?;
        put(&fdir, keys::BACKEND, &bdir)?;
        put(&fdir, keys::BACKEND_ID, &backend.to_string())?;
        put(&fdir, keys::STATE, &initialising)?;
        Ok(())
    })?;
    tracing::info!(domu = spec.domu, devid = spec.devid, mac = %spec.mac, sessions = sessions.len(), "xmx device attached");
    Ok(())
}

/// Remove both halves of a device. Removing what is already gone is not an error; the
/// call fails with [`Error::NotFound`] only if neither directory existed.
pub fn detach(xs: &dyn Xenstore, backend: DomId, domu: DomId, devid: u32) -> Result<()> {
    let bdir = xenbus::backend_dir(backend, domu, devid);
    let fdir = xenbus::frontend_dir(domu, devid);
    let removed = in_transaction(xs, |tx| {
        let mut removed = 0;
        for dir in [&bdir, &fdir] {
            // xenstored accepts removing a missing node whose parent exists: look first.
            if !exists(xs, tx, dir)? {
                continue;
            }
            match xs.rm(tx, dir) {
                Ok(()) => removed += 1,
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    });
    let removed = match removed {
        Ok(n) => n,
        Err(e @ Error::NotFound(_)) => return Err(e),
        Err(e) => {
            // While a domain dies the toolstack removes its nodes too, and real
            // xenstored can refuse our transaction for it; what matters is
            // whether both halves are gone now.
            if exists(xs, xmx_hv::XBT_NULL, &bdir)? || exists(xs, xmx_hv::XBT_NULL, &fdir)? {
                return Err(e);
            }
            tracing::debug!(domu, devid, error = %e, "xmx device nodes were removed meanwhile");
            1
        }
    };
    if removed == 0 {
        return Err(Error::NotFound(format!("no xmx device {domu}/{devid}")));
    }
    tracing::info!(domu, devid, "xmx device detached");
    Ok(())
}
