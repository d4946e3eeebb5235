//! What the guest daemon hands an application: an open endpoint's memory and port, or a
//! registered region's window, with the descriptors that give access to them.
//!
//! Both are encoded as bytes plus descriptors (see [`xmx_hv::handoff`]) so they can
//! travel in one message over the daemon's unix socket.

use std::collections::VecDeque;
use std::os::fd::{BorrowedFd, OwnedFd};

use xmx_hv::{ExportedPages, ExportedPort};
use xmx_wire::msg::{EndpointPages, ENDPOINT_RING_PAGES_MAX, INFO_PAGE_REFS, REGION_PAGES_MAX};

use crate::error::{Error, Result};

/// An open endpoint, as handed to the application that owns it.
#[derive(Debug)]
pub struct EndpointHandoff {
    /// Endpoint index.
    pub endpoint: u8,
    /// Session id the backend gave the endpoint.
    pub session_id: u32,
    /// How the pages are laid out (send ring, event ring, send queue, receive queue).
    pub geometry: EndpointPages,
    /// Counts the endpoint's (re)openings: 0 at first, +1 at each re-open after the
    /// device reconnected (resume, backend restart).
    pub generation: u32,
    /// On a re-open: the endpoint's regions are registered again under their ids over the
    /// same pages, so the application's windows stay valid.
    pub regions_kept: bool,
    /// With `regions_kept`: the regions are registered again over new pages that hold
    /// what the old ones held (the domain moved, and real Xen does not carry grants):
    /// the application maps each of its windows anew
    /// ([`crate::frontd::FrontdClient::refresh_window`]) before it posts anything.
    pub regions_moved: bool,
    /// Every page of the endpoint, in info-page order.
    pub pages: ExportedPages,
    /// The endpoint's event channel.
    pub port: ExportedPort,
}

/// A registered region, as handed to the application.
#[derive(Debug)]
pub struct RegionHandoff {
    /// Endpoint the region belongs to.
    pub endpoint: u8,
    /// Region id within the endpoint (what RNDV and PULL name).
    pub region_id: u8,
    /// Bytes registered, from the start of the first page.
    pub length: u32,
    /// The region's pages.
    pub pages: ExportedPages,
}

/// Check an endpoint geometry against what one info page and the ring format allow.
pub fn check_geometry(g: &EndpointPages) -> Result<()> {
    let ring_ok = |n: u8| (1..=ENDPOINT_RING_PAGES_MAX).contains(&n);
    if !ring_ok(g.send_ring) || !ring_ok(g.event_ring) {
        return Err(Error::Invalid(format!(
            "ring pages must be 1 to {ENDPOINT_RING_PAGES_MAX}"
        )));
    }
    if g.send_queue == 0 || g.recv_queue == 0 {
        return Err(Error::Invalid("queues need at least one page".into()));
    }
    if g.total() > INFO_PAGE_REFS {
        return Err(Error::Invalid(format!(
            "{} pages do not fit one info page ({INFO_PAGE_REFS})",
            g.total()
        )));
    }
    Ok(())
}

impl EndpointHandoff {
    /// Append the encoding to `out`, the descriptors to `fds`.
    pub fn emit<'a>(&'a self, out: &mut Vec<u8>, fds: &mut Vec<BorrowedFd<'a>>) {
        out.push(self.endpoint);
        out.extend_from_slice(&self.session_id.to_le_bytes());
        out.push(self.geometry.send_ring);
        out.push(self.geometry.event_ring);
        out.extend_from_slice(&self.geometry.send_queue.to_le_bytes());
        out.extend_from_slice(&self.geometry.recv_queue.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.push(u8::from(self.regions_kept) | u8::from(self.regions_moved) << 1);
        self.pages.emit(out, fds);
        self.port.emit(out, fds);
    }

    /// Decode from the front of `buf`, taking descriptors from `fds`; checked.
    pub fn parse(buf: &mut &[u8], fds: &mut VecDeque<OwnedFd>) -> Result<EndpointHandoff> {
        let mut r = Fields(buf);
        let endpoint = r.u8()?;
        let session_id = r.u32()?;
        let geometry = EndpointPages {
            send_ring: r.u8()?,
            event_ring: r.u8()?,
            send_queue: r.u16()?,
            recv_queue: r.u16()?,
        };
        let generation = r.u32()?;
        let regions = r.u8()?;
        let (regions_kept, regions_moved) = (regions & 1 != 0, regions & 2 != 0);
        *buf = r.0;
        check_geometry(&geometry)?;
        let pages = ExportedPages::parse(buf, fds)?;
        let port = ExportedPort::parse(buf, fds)?;
        if pages.page_count() != geometry.total() {
            return Err(Error::Protocol(format!(
                "endpoint of {} pages handed over as {}",
                geometry.total(),
                pages.page_count()
            )));
        }
        Ok(EndpointHandoff {
            endpoint,
            session_id,
            geometry,
            generation,
            regions_kept,
            regions_moved,
            pages,
            port,
        })
    }
}

impl RegionHandoff {
    /// Append the encoding to `out`, the descriptors to `fds`.
    pub fn emit<'a>(&'a self, out: &mut Vec<u8>, fds: &mut Vec<BorrowedFd<'a>>) {
        out.push(self.endpoint);
        out.push(self.region_id);
        out.extend_from_slice(&self.length.to_le_bytes());
        self.pages.emit(out, fds);
    }

    /// Decode from the front of `buf`, taking descriptors from `fds`; checked.
    pub fn parse(buf: &mut &[u8], fds: &mut VecDeque<OwnedFd>) -> Result<RegionHandoff> {
        let mut r = Fields(buf);
        let endpoint = r.u8()?;
        let region_id = r.u8()?;
        let length = r.u32()?;
        *buf = r.0;
        let pages = ExportedPages::parse(buf, fds)?;
        if length == 0
            || pages.page_count() > REGION_PAGES_MAX
            || (length as usize).div_ceil(xmx_hv::PAGE_SIZE) != pages.page_count()
        {
            return Err(Error::Protocol(format!(
                "region of {length} bytes handed over as {} pages",
                pages.page_count()
            )));
        }
        Ok(RegionHandoff {
            endpoint,
            region_id,
            length,
            pages,
        })
    }
}

/// Bounded little-endian reads.
pub(crate) struct Fields<'a>(pub(crate) &'a [u8]);

impl<'a> Fields<'a> {
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(Error::Protocol(format!(
                "message truncated: need {n} bytes, have {}",
                self.0.len()
            )));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        let b = self.bytes(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn string(&mut self, max: usize) -> Result<String> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(Error::Protocol(format!(
                "string of {n} bytes (at most {max})"
            )));
        }
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::Protocol("string is not UTF-8".into()))
    }
}

/// Append a length-prefixed string (cut at `u16::MAX` bytes on a char boundary).
pub(crate) fn put_string(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometries_are_checked() {
        let ok = EndpointPages {
            send_ring: 1,
            event_ring: 8,
            send_queue: 1,
            recv_queue: 1,
        };
        assert!(check_geometry(&ok).is_ok());
        assert!(check_geometry(&crate::device::DEFAULT_ENDPOINT_PAGES).is_ok());
        for bad in [
            EndpointPages { send_ring: 0, ..ok },
            EndpointPages {
                event_ring: 9,
                ..ok
            },
            EndpointPages {
                send_queue: 0,
                ..ok
            },
            EndpointPages {
                recv_queue: 0,
                ..ok
            },
            EndpointPages {
                send_queue: 600,
                recv_queue: 600,
                ..ok
            },
        ] {
            assert!(
                matches!(check_geometry(&bad), Err(Error::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn strings_round_trip_and_are_bounded() {
        let mut out = Vec::new();
        put_string(&mut out, "host:0");
        let mut f = Fields(&out);
        assert_eq!(f.string(100).unwrap(), "host:0");
        assert!(f.0.is_empty());
        let mut f = Fields(&out);
        assert!(f.string(3).is_err());
        let mut f = Fields(&out[..4]);
        assert!(f.string(100).is_err());
        let bad = [2u8, 0, 0xff, 0xfe];
        assert!(Fields(&bad).string(10).is_err());
    }
}
