//! The peer view: the peers one guest may reach (its virtual cluster's), as the toolstack's
//! peer service (xmxd) publishes them in xenstore and the guest's library reads them.
//!
//! `/local/domain/<toolstack>/xmx/peers/<domid>/` holds one node per peer:
//! `<index> = "<mac> <hostname>"`. The index is the one the backend's engine routes by, so
//! it is what send requests name. Both sides use this module: [`view_dir`] and
//! [`entry_value`] to write, [`parse_entry`] to read.

use crate::mxoe::Mac;

/// The directory holding guest `domid`'s view, published by domain `toolstack`.
pub fn view_dir(toolstack: u16, domid: u16) -> String {
    format!("/local/domain/{toolstack}/xmx/peers/{domid}")
}

/// The value of the node of the peer at `mac` named `hostname`.
pub fn entry_value(mac: Mac, hostname: &str) -> String {
    format!("{mac} {hostname}")
}

/// One peer of a view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewEntry {
    /// The peer's index in the engine's peer table.
    pub index: u16,
    /// The peer's board address.
    pub mac: Mac,
    /// Its MX hostname (may be empty).
    pub hostname: String,
}

/// One node of the view: its name (the index) and value (`"<mac> <hostname>"`). A node
/// value may end in NULs (some writers include the terminator); they are ignored.
pub fn parse_entry(name: &str, value: &str) -> Result<ViewEntry, String> {
    let index: u16 = name
        .trim()
        .parse()
        .map_err(|_| format!("peer index {name:?} is not a number below 65536"))?;
    let value = value.trim_end_matches('\0').trim();
    let (mac, hostname) = value.split_once(' ').unwrap_or((value, ""));
    let mac: Mac = mac
        .parse()
        .map_err(|e| format!("peer {index}: MAC {mac:?}: {e}"))?;
    if !mac.is_unicast() {
        return Err(format!("peer {index}: {mac} is not a unicast address"));
    }
    Ok(ViewEntry {
        index,
        mac,
        hostname: hostname.trim().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back() {
        let mac = Mac([0x06, 0x47, 0x81, 0x33, 0x14, 0x9e]);
        let value = entry_value(mac, "h0-g0:0");
        assert_eq!(value, "06:47:81:33:14:9e h0-g0:0");
        let e = parse_entry("3", &value).unwrap();
        assert_eq!(
            e,
            ViewEntry {
                index: 3,
                mac,
                hostname: "h0-g0:0".into()
            }
        );
        assert_eq!(view_dir(0, 5), "/local/domain/0/xmx/peers/5");
    }
}
