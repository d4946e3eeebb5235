//! Starting and stopping a simulated host on a directory.
//!
//! [`Daemon::start`] takes the directory's lock (a second daemon on the same directory
//! is refused while the first lives; leftovers of a crashed one are replaced), brings up
//! dom0 and the admin socket, and writes `DIR/ready`. [`DaemonHandle::shutdown`] (or
//! drop) closes every connection, joins every thread and removes the sockets, the domain
//! directories and `ready`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{Flock, FlockArg};
use xmx_hv::daemon::control::LineServer;
use xmx_hv::sim::{layout, SimAdmin, SimPlatform};
use xmx_hv::{DomId, Error, Result};

use crate::admin::serve_admin;
use crate::config::SimhvConfig;
use crate::domains::HostDomains;

/// Entry point of an in-process simulated host.
pub struct Daemon;

/// A running simulated host; dropping it shuts it down.
pub struct DaemonHandle {
    dir: PathBuf,
    host: Arc<HostDomains>,
    admin: Option<LineServer>,
    lock: Option<Flock<File>>,
}

impl Daemon {
    /// Serve `dir` with threads of this process until the handle is shut down.
    pub fn start(dir: impl AsRef<Path>, config: SimhvConfig) -> Result<DaemonHandle> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let lock_file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join(layout::LOCK_FILE))?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            if e == nix::errno::Errno::EWOULDBLOCK {
                Error::Busy(format!("another xmx-simhv serves {}", dir.display()))
            } else {
                Error::Io(e.into())
            }
        })?;
        remove_leftovers(&dir)?;

        let host = Arc::new(HostDomains::new(&dir, config));
        let mut handle = DaemonHandle {
            dir: dir.clone(),
            host: host.clone(),
            admin: None,
            lock: Some(lock),
        };
        host.start_dom0()?;
        handle.admin = Some(serve_admin(host, &layout::ctl_sock(&dir))?);
        write_ready(&dir)?;
        tracing::info!(dir = %dir.display(), "xmx-simhv ready");
        Ok(handle)
    }
}

fn remove_leftovers(dir: &Path) -> Result<()> {
    for name in [layout::READY_FILE, layout::CTL_SOCK] {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Io(e)),
        }
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let is_dom = name.to_str().and_then(layout::parse_dom_dir_name).is_some();
        if is_dom && entry.file_type()?.is_dir() {
            tracing::info!(path = %entry.path().display(), "removing a stale domain directory");
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}

fn write_ready(dir: &Path) -> Result<()> {
    let tmp = dir.join(".ready.tmp");
    let mut f = File::create(&tmp)?;
    writeln!(f, "{}", std::process::id())?;
    f.sync_all()?;
    std::fs::rename(&tmp, layout::ready_file(dir))?;
    Ok(())
}

impl DaemonHandle {
    /// The directory served.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new admin client of this host.
    pub fn admin(&self) -> Result<SimAdmin> {
        SimAdmin::connect(&self.dir)
    }

    /// Attach to one of this host's domains as a process of it.
    pub fn attach(&self, domid: DomId) -> Result<SimPlatform> {
        SimPlatform::attach(&self.dir, domid)
    }

    /// Stop serving and clean up.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.lock.is_none() {
            return;
        }
        let _ = std::fs::remove_file(layout::ready_file(&self.dir));
        if let Some(mut a) = self.admin.take() {
            a.stop();
        }
        self.host.shutdown();
        // Released last: no other daemon may start on the directory while we clean it.
        self.lock = None;
        tracing::info!(dir = %self.dir.display(), "xmx-simhv stopped");
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        self.stop();
    }
}
