//! The xenstore names of the direct channel between two co-located guests.
//!
//! xmxd (dom0) brokers a channel between two guests of one host that are in
//! the same virtual cluster; only it creates and removes the nodes below, so
//! a guest can neither offer itself a channel nor keep one dom0 revoked:
//!
//! ```text
//! /local/domain/<ts>/xmx/direct/
//!     offers/<domid>/                 owner dom0, readable by <domid> only
//!         <peer domid> = "<peer mac>" the co-located guests <domid> may talk to
//!     pair-<lo>-<hi>/                 owner dom0, read/write for <lo> and <hi> only
//!         <cep>-<aep>/                one channel, created by guest <lo> (the
//!             refs = "r1,r2,..."      creator) for its endpoint <cep> and the
//!             port = "<evtchn>"       endpoint <aep> of guest <hi> (the acceptor):
//!             state = "offered" | "connected" | "closed"
//! ```
//!
//! The lower domain id of the pair always creates (grants the pages and
//! allocates the unbound event channel): two endpoints that start talking at
//! once then never build two channels. Removing the pair directory revokes
//! every channel of the pair; each guest's library unmaps and falls back to
//! the backend path (its protocol core retransmits whatever the channel had
//! not delivered).

/// The root of the direct-channel nodes.
pub fn root(toolstack: u16) -> String {
    format!("/local/domain/{toolstack}/xmx/direct")
}

/// Where guest `domid` finds the guests it may open a channel with.
pub fn offers_dir(toolstack: u16, domid: u16) -> String {
    format!("{}/offers/{domid}", root(toolstack))
}

/// The directory of the pair `a`, `b` (in either order).
pub fn pair_dir(toolstack: u16, a: u16, b: u16) -> String {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    format!("{}/pair-{lo}-{hi}", root(toolstack))
}

/// The name of a channel's directory inside its pair directory.
pub fn channel_name(creator_ep: u8, acceptor_ep: u8) -> String {
    format!("{creator_ep}-{acceptor_ep}")
}

/// The endpoints a channel directory's name stands for (creator, acceptor).
pub fn parse_channel_name(name: &str) -> Option<(u8, u8)> {
    let (c, a) = name.split_once('-')?;
    Some((c.parse().ok()?, a.parse().ok()?))
}

/// The `refs` node's value.
pub fn format_refs(refs: &[u32]) -> String {
    refs.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The grant references of a `refs` node: `None` if malformed or longer
/// than `max`.
pub fn parse_refs(text: &str, max: usize) -> Option<Vec<u32>> {
    let refs: Vec<u32> = text
        .split(',')
        .take(max + 1)
        .map(|r| r.trim().parse().ok())
        .collect::<Option<_>>()?;
    (!refs.is_empty() && refs.len() <= max).then_some(refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(pair_dir(0, 7, 3), "/local/domain/0/xmx/direct/pair-3-7");
        assert_eq!(pair_dir(0, 3, 7), pair_dir(0, 7, 3));
        assert_eq!(offers_dir(0, 5), "/local/domain/0/xmx/direct/offers/5");
        assert_eq!(parse_channel_name(&channel_name(2, 255)), Some((2, 255)));
        for bad in ["", "2", "2-", "-3", "2-256", "a-b", "1-2-3"] {
            assert_eq!(parse_channel_name(bad), None, "{bad}");
        }
        assert_eq!(
            parse_refs(&format_refs(&[1, 2, 40]), 3),
            Some(vec![1, 2, 40])
        );
        assert_eq!(parse_refs("1,2,3,4", 3), None);
        assert_eq!(parse_refs("", 3), None);
        assert_eq!(parse_refs("1,x", 3), None);
    }
}
