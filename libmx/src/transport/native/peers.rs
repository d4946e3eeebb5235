//! The native board's peer table: read from `XMX_PEERS`, completed by host
//! discovery and by mapper calls.
//!
//! `XMX_PEERS` names a JSON file listing the boards this one may talk to:
//!
//! ```json
//! [{"index": 0, "mac": "02:00:00:00:00:01", "hostname": "h0"},
//!  {"mac": "02:00:00:00:00:02"}]
//! ```
//!
//! `index` (the peer index frames carry) is kept when given, else the
//! lowest free one is taken; `hostname` may be left out and learnt by
//! HOST_QUERY. The board itself is in the table too, under its own
//! hostname. MX hostnames are `host:board`; a name without `:board` means
//! board 0.

use serde::Deserialize;
use xmx_engine::{ClusterId, PeerEntry};
use xmx_wire::mxoe::{Mac, HOSTNAME_LEN_MAX};

/// Every native peer is in one virtual cluster: isolation is a matter for
/// the Xen backend, not for a host talking for itself.
pub(super) const CLUSTER: ClusterId = ClusterId(0);

/// One entry of the `XMX_PEERS` file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PeersFileEntry {
    /// Peer index to use, if fixed.
    #[serde(default)]
    pub(crate) index: Option<u16>,
    /// Board address, `xx:xx:xx:xx:xx:xx`.
    pub(crate) mac: String,
    /// MX hostname, if known.
    #[serde(default)]
    pub(crate) hostname: Option<String>,
}

/// Parses the content of an `XMX_PEERS` file.
pub(super) fn parse_specs(text: &str) -> Result<Vec<PeersFileEntry>, String> {
    serde_json::from_str(text).map_err(|e| format!("peer list: {e}"))
}

/// The MX hostname for `name`: itself if it names a board (`host:N`), else
/// board 0 of that host.
pub(crate) fn board_name(name: &str) -> String {
    let name = name.trim();
    match name.rsplit_once(':') {
        Some((host, board)) if !host.is_empty() && board.parse::<u32>().is_ok() => name.to_owned(),
        _ => format!("{name}:0"),
    }
}

/// Checks that a hostname fits a HOST_REPLY: 1 to 79 bytes, no NUL.
pub(super) fn check_hostname(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() >= HOSTNAME_LEN_MAX || name.contains('\0') {
        return Err(format!(
            "hostname {name:?} must have 1 to {} bytes and no NUL",
            HOSTNAME_LEN_MAX - 1
        ));
    }
    Ok(())
}

/// The first index no entry uses.
fn free_index(entries: &[PeerEntry]) -> Option<u16> {
    (0..=u16::MAX).find(|i| !entries.iter().any(|e| e.index == *i))
}

/// The table for the board `own` named `own_name`, with the peers of
/// `specs`. Unknown hostnames are empty.
pub(super) fn initial_table(
    own: Mac,
    own_name: &str,
    specs: &[PeersFileEntry],
) -> Result<Vec<PeerEntry>, String> {
    check_hostname(own_name)?;
    let mut entries: Vec<PeerEntry> = Vec::new();
    let mut unplaced = Vec::new();
    for spec in specs {
        let mac: Mac = spec
            .mac
            .parse()
            .map_err(|e| format!("peer {:?}: {e}", spec.mac))?;
        if !mac.is_unicast() {
            return Err(format!("peer {mac}: not a unicast address"));
        }
        let hostname = match &spec.hostname {
            _ if mac == own => own_name.to_owned(),
            Some(h) => {
                let h = board_name(h);
                check_hostname(&h)?;
                h
            }
            None => String::new(),
        };
        if entries
            .iter()
            .chain(&unplaced)
            .any(|e: &PeerEntry| e.mac == mac)
        {
            return Err(format!("peer {mac} is listed twice"));
        }
        let entry = PeerEntry {
            index: spec.index.unwrap_or(0),
            mac,
            hostname,
            cluster: CLUSTER,
        };
        match spec.index {
            Some(i) if entries.iter().any(|e| e.index == i) => {
                return Err(format!("peer index {i} is given twice"));
            }
            Some(_) => entries.push(entry),
            None => unplaced.push(entry),
        }
    }
    if !entries.iter().chain(&unplaced).any(|e| e.mac == own) {
        unplaced.insert(
            0,
            PeerEntry {
                index: 0,
                mac: own,
                hostname: own_name.to_owned(),
                cluster: CLUSTER,
            },
        );
    }
    for mut entry in unplaced {
        entry.index = free_index(&entries).ok_or("the peer table is full")?;
        entries.push(entry);
    }
    entries.sort_by_key(|e| e.index);
    Ok(entries)
}

/// `entries` with `mac` added at the lowest free index, or renamed if
/// present (`None` keeps its name).
pub(super) fn with_peer(
    entries: &[PeerEntry],
    mac: Mac,
    hostname: Option<&str>,
) -> Result<Vec<PeerEntry>, String> {
    let mut out = entries.to_vec();
    let name = hostname.map(board_name);
    if let Some(n) = &name {
        check_hostname(n)?;
    }
    match out.iter_mut().find(|e| e.mac == mac) {
        Some(e) => {
            if let Some(n) = name {
                e.hostname = n;
            }
        }
        None => {
            if !mac.is_unicast() {
                return Err(format!("peer {mac}: not a unicast address"));
            }
            let index = free_index(&out).ok_or("the peer table is full")?;
            out.push(PeerEntry {
                index,
                mac,
                hostname: name.unwrap_or_default(),
                cluster: CLUSTER,
            });
        }
    }
    Ok(out)
}

/// `entries` without `mac`.
pub(super) fn without_peer(entries: &[PeerEntry], mac: Mac) -> Vec<PeerEntry> {
    entries.iter().filter(|e| e.mac != mac).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: Mac = Mac([2, 0, 0, 0, 0, 1]);

    fn spec(index: Option<u16>, mac: &str, hostname: Option<&str>) -> PeersFileEntry {
        PeersFileEntry {
            index,
            mac: mac.into(),
            hostname: hostname.map(Into::into),
        }
    }

    #[test]
    fn hostnames_name_a_board() {
        assert_eq!(board_name("h0"), "h0:0");
        assert_eq!(board_name(" h0:3 "), "h0:3");
        assert_eq!(board_name("fe80::1"), "fe80::1");
        assert_eq!(board_name("a:b"), "a:b:0");
        assert!(check_hostname(&"x".repeat(79)).is_ok());
        assert!(check_hostname(&"x".repeat(80)).is_err());
        assert!(check_hostname("").is_err());
        assert!(check_hostname("a\0").is_err());
    }

    #[test]
    fn the_file_format() {
        let specs = parse_specs(
            r#"[{"index": 3, "mac": "02:00:00:00:00:02", "hostname": "h1"},
                {"mac": "02:00:00:00:00:03"}]"#,
        )
        .unwrap();
        assert_eq!(
            specs,
            vec![
                spec(Some(3), "02:00:00:00:00:02", Some("h1")),
                spec(None, "02:00:00:00:00:03", None)
            ]
        );
        assert!(parse_specs(r#"[{"mac": "x", "colour": 1}]"#).is_err());
        assert!(parse_specs("{}").is_err());
    }

    #[test]
    fn indices_are_kept_or_taken_from_the_lowest_free() {
        let t = initial_table(
            OWN,
            "me:0",
            &[
                spec(Some(1), "02:00:00:00:00:02", Some("h1")),
                spec(None, "02:00:00:00:00:03", None),
            ],
        )
        .unwrap();
        let view: Vec<(u16, u8, &str)> = t
            .iter()
            .map(|e| (e.index, e.mac.0[5], e.hostname.as_str()))
            .collect();
        assert_eq!(view, vec![(0, 1, "me:0"), (1, 2, "h1:0"), (2, 3, "")]);
        // The board's own entry keeps its index and takes the board's name.
        let t = initial_table(
            OWN,
            "me:0",
            &[spec(Some(7), "02:00:00:00:00:01", Some("x"))],
        )
        .unwrap();
        assert_eq!((t[0].index, t[0].hostname.as_str()), (7, "me:0"));
    }

    #[test]
    fn bad_lists_are_refused() {
        for specs in [
            vec![spec(None, "02:00:00:00:00:0g", None)],
            vec![spec(None, "03:00:00:00:00:02", None)],
            vec![
                spec(Some(1), "02:00:00:00:00:02", None),
                spec(Some(1), "02:00:00:00:00:03", None),
            ],
            vec![
                spec(None, "02:00:00:00:00:02", None),
                spec(Some(4), "02:00:00:00:00:02", None),
            ],
            vec![spec(None, "02:00:00:00:00:02", Some(&"y".repeat(90)))],
        ] {
            assert!(initial_table(OWN, "me:0", &specs).is_err(), "{specs:?}");
        }
        assert!(initial_table(OWN, "", &[]).is_err());
    }

    #[test]
    fn adding_renaming_removing() {
        let t = initial_table(OWN, "me:0", &[spec(Some(2), "02:00:00:00:00:02", None)]).unwrap();
        let peer = Mac([2, 0, 0, 0, 0, 9]);
        let t = with_peer(&t, peer, None).unwrap();
        assert_eq!(
            t.last().map(|e| (e.index, e.hostname.as_str())),
            Some((1, ""))
        );
        let t = with_peer(&t, peer, Some("far")).unwrap();
        assert_eq!(t.iter().find(|e| e.mac == peer).unwrap().hostname, "far:0");
        assert!(with_peer(&t, Mac::BROADCAST, None).is_err());
        let t = without_peer(&t, peer);
        assert!(t.iter().all(|e| e.mac != peer));
        assert_eq!(t.len(), 2);
    }
}
