//! The discovery messages xmxd instances exchange: payloads of MXoE RAW packets (type 1,
//! the channel MX's mapper uses), on the same Ethernet segment the data travels.
//!
//! ```text
//! offset  size  field
//!   0      4    magic 0x584d5844 ("XMXD")
//!   4      1    version (1)
//!   5      1    kind: 1 ANNOUNCE (the sender's guests), 2 SOLICIT (announce yourselves)
//!   6      2    reserved, 0
//!   8      4    generation of the sender's guest list (changes whenever the list does)
//!  12      4    ttl_ms: forget the sender's guests after this long without news
//!  16      1    fragment: this message's position in its generation, from 0
//!  17      1    fragments: how many messages the generation takes (at least 1)
//!  18      1    entries in this message
//!  19      1    host name length H (1..=63)
//!  20      H    host name (UTF-8)
//!  then, per entry:
//!   +0     2    peer index claimed (0xffff: none yet)
//!   +2     4    claimed since (seconds since the epoch)
//!   +6     6    board MAC of the guest
//!  +12     4    cluster id
//!  +16     1    cluster name length C (1..=32), then C bytes
//!    .     1    guest name length G (1..=64), then G bytes
//! ```
//!
//! Every multi-byte field is big-endian, as everywhere in MXoE. A RAW frame is at most
//! 1024 bytes, so a long guest list is split into fragments of one generation; the
//! receiver replaces a host's list only once it holds every fragment of a generation.
//! Bytes after the last entry (Ethernet padding) are ignored.

use xmx_wire::mxoe::{
    FrameRepr, HeadRepr, Mac, PacketRepr, RawRepr, HEAD_LEN, RAW_PAYLOAD_LEN_MAX,
};
use xmx_wire::{Error, Result};

use super::names;

/// First bytes of every discovery message.
pub(crate) const MAGIC: u32 = 0x584d_5844;
/// Version of the message layout.
pub(crate) const VERSION: u8 = 1;
/// Peer index field meaning "no index claimed".
pub(crate) const NO_INDEX: u16 = 0xffff;
/// Longest message: a RAW frame's whole payload.
pub(crate) const MESSAGE_LEN_MAX: usize = RAW_PAYLOAD_LEN_MAX;

/// Byte offsets of a message.
pub(crate) mod field {
    use std::ops::Range;

    /// The magic number, [`MAGIC`](super::MAGIC).
    pub(crate) const MAGIC: Range<usize> = 0..4;
    /// The layout version.
    pub(crate) const VERSION: usize = 4;
    /// The message kind.
    pub(crate) const KIND: usize = 5;
    // Bytes 6..8 are reserved, 0.
    /// Generation of the sender's guest list.
    pub(crate) const GENERATION: Range<usize> = 8..12;
    /// How long the sender's list stays valid, in milliseconds.
    pub(crate) const TTL_MS: Range<usize> = 12..16;
    /// This message's position in its generation.
    pub(crate) const FRAGMENT: usize = 16;
    /// Messages in the generation.
    pub(crate) const FRAGMENTS: usize = 17;
    /// Entries in this message.
    pub(crate) const ENTRIES: usize = 18;
    /// Length of the host name.
    pub(crate) const HOST_NAME_LEN: usize = 19;
    /// The host name, then the entries.
    pub(crate) const HOST_NAME: usize = 20;

    /// Offsets inside one entry.
    pub(crate) mod entry {
        use std::ops::Range;

        /// Peer index claimed ([`NO_INDEX`](super::super::NO_INDEX): none yet).
        pub(crate) const INDEX: Range<usize> = 0..2;
        /// When the claim was first made, in seconds since the epoch.
        pub(crate) const SINCE: Range<usize> = 2..6;
        /// Board MAC of the guest.
        pub(crate) const MAC: Range<usize> = 6..12;
        /// Cluster id.
        pub(crate) const CLUSTER: Range<usize> = 12..16;
        /// Length of the cluster name, which follows; then the guest name's length and
        /// bytes.
        pub(crate) const CLUSTER_NAME_LEN: usize = 16;
        /// Length of the fixed part, up to the cluster name.
        pub(crate) const FIXED_LEN: usize = 17;
    }
}

/// What a message asks or tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AnnounceKind {
    /// The sender's guests.
    Announce = 1,
    /// The sender just started: everyone announces at once.
    Solicit = 2,
}

impl AnnounceKind {
    fn from_u8(v: u8) -> Result<AnnounceKind> {
        match v {
            1 => Ok(AnnounceKind::Announce),
            2 => Ok(AnnounceKind::Solicit),
            other => Err(Error::Unknown {
                what: "discovery message kind",
                value: u32::from(other),
            }),
        }
    }
}

fn be16(buf: &[u8], at: usize) -> Result<u16> {
    buf.get(at..at + 2)
        .and_then(|b| b.try_into().ok())
        .map(u16::from_be_bytes)
        .ok_or(Error::Truncated {
            needed: at + 2,
            have: buf.len(),
        })
}

fn be32(buf: &[u8], at: usize) -> Result<u32> {
    buf.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_be_bytes)
        .ok_or(Error::Truncated {
            needed: at + 4,
            have: buf.len(),
        })
}

fn byte(buf: &[u8], at: usize) -> Result<u8> {
    buf.get(at).copied().ok_or(Error::Truncated {
        needed: at + 1,
        have: buf.len(),
    })
}

fn bytes(buf: &[u8], at: usize, len: usize) -> Result<&[u8]> {
    buf.get(at..at + len).ok_or(Error::Truncated {
        needed: at + len,
        have: buf.len(),
    })
}

/// A zero-copy view of a discovery message's fixed header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MessagePacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> MessagePacket<T> {
    /// Wrap a buffer that holds at least the header and the host name it announces.
    pub(crate) fn new_checked(buffer: T) -> Result<Self> {
        let buf = buffer.as_ref();
        let name_len = usize::from(byte(buf, field::HOST_NAME_LEN)?);
        bytes(buf, field::HOST_NAME, name_len)?;
        Ok(MessagePacket { buffer })
    }

    /// The magic number.
    pub(crate) fn magic(&self) -> u32 {
        be32(self.buffer.as_ref(), field::MAGIC.start).unwrap_or(0)
    }

    /// The layout version.
    pub(crate) fn version(&self) -> u8 {
        byte(self.buffer.as_ref(), field::VERSION).unwrap_or(0)
    }

    /// The raw kind byte.
    pub(crate) fn kind(&self) -> u8 {
        byte(self.buffer.as_ref(), field::KIND).unwrap_or(0)
    }

    /// Generation of the sender's list.
    pub(crate) fn generation(&self) -> u32 {
        be32(self.buffer.as_ref(), field::GENERATION.start).unwrap_or(0)
    }

    /// How long the sender's list stays valid, in milliseconds.
    pub(crate) fn ttl_ms(&self) -> u32 {
        be32(self.buffer.as_ref(), field::TTL_MS.start).unwrap_or(0)
    }

    /// Position of this message in its generation.
    pub(crate) fn fragment(&self) -> u8 {
        byte(self.buffer.as_ref(), field::FRAGMENT).unwrap_or(0)
    }

    /// Messages in the generation.
    pub(crate) fn fragments(&self) -> u8 {
        byte(self.buffer.as_ref(), field::FRAGMENTS).unwrap_or(0)
    }

    /// Entries in this message.
    pub(crate) fn entry_count(&self) -> u8 {
        byte(self.buffer.as_ref(), field::ENTRIES).unwrap_or(0)
    }

    /// The sender's host name bytes.
    pub(crate) fn host_name(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let len = usize::from(byte(buf, field::HOST_NAME_LEN).unwrap_or(0));
        bytes(buf, field::HOST_NAME, len).unwrap_or(&[])
    }

    /// Everything after the host name: the entries, then any padding.
    pub(crate) fn entries_bytes(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let start = field::HOST_NAME + self.host_name().len();
        buf.get(start..).unwrap_or(&[])
    }
}

/// One guest as a host announces it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct EntryRepr {
    /// The peer index claimed for it, if any yet.
    pub(crate) index: Option<u16>,
    /// When that claim was first made (seconds since the epoch).
    pub(crate) since: u32,
    /// Its board MAC.
    pub(crate) mac: Mac,
    /// Its cluster's id.
    pub(crate) cluster: u32,
    /// Its cluster's name.
    pub(crate) cluster_name: String,
    /// Its (base) guest name.
    pub(crate) guest: String,
}

impl EntryRepr {
    /// Bytes the entry occupies.
    pub(crate) fn buffer_len(&self) -> usize {
        field::entry::FIXED_LEN + self.cluster_name.len() + 1 + self.guest.len()
    }

    fn validate(&self) -> Result<()> {
        if self.index == Some(NO_INDEX) {
            return Err(Error::Invalid {
                field: "peer index",
                reason: "0xffff means none",
            });
        }
        if !self.mac.is_unicast() {
            return Err(Error::Invalid {
                field: "guest MAC",
                reason: "not unicast",
            });
        }
        names::check_cluster_name(&self.cluster_name).map_err(|_| Error::Invalid {
            field: "cluster name",
            reason: "not a cluster name",
        })?;
        names::check_guest_name(&self.guest).map_err(|_| Error::Invalid {
            field: "guest name",
            reason: "not a guest name",
        })?;
        Ok(())
    }

    /// Read one entry at the start of `buf`; returns it and its length.
    fn parse(buf: &[u8]) -> Result<(EntryRepr, usize)> {
        use field::entry as f;
        let index = be16(buf, f::INDEX.start)?;
        let since = be32(buf, f::SINCE.start)?;
        let mac: [u8; 6] =
            bytes(buf, f::MAC.start, 6)?
                .try_into()
                .map_err(|_| Error::Truncated {
                    needed: f::MAC.end,
                    have: buf.len(),
                })?;
        let cluster = be32(buf, f::CLUSTER.start)?;
        let cluster_len = usize::from(byte(buf, f::CLUSTER_NAME_LEN)?);
        let cluster_name = bytes(buf, f::FIXED_LEN, cluster_len)?;
        let guest_len_at = f::FIXED_LEN + cluster_len;
        let guest_len = usize::from(byte(buf, guest_len_at)?);
        let guest = bytes(buf, guest_len_at + 1, guest_len)?;
        let text = |b: &[u8], field: &'static str| {
            std::str::from_utf8(b)
                .map(str::to_owned)
                .map_err(|_| Error::Invalid {
                    field,
                    reason: "not UTF-8",
                })
        };
        let entry = EntryRepr {
            index: (index != NO_INDEX).then_some(index),
            since,
            mac: Mac(mac),
            cluster,
            cluster_name: text(cluster_name, "cluster name")?,
            guest: text(guest, "guest name")?,
        };
        entry.validate()?;
        Ok((entry, guest_len_at + 1 + guest_len))
    }

    fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.index.unwrap_or(NO_INDEX).to_be_bytes());
        out.extend_from_slice(&self.since.to_be_bytes());
        out.extend_from_slice(&self.mac.0);
        out.extend_from_slice(&self.cluster.to_be_bytes());
        // Lengths were checked by validate: both names fit in a byte.
        out.push(self.cluster_name.len() as u8);
        out.extend_from_slice(self.cluster_name.as_bytes());
        out.push(self.guest.len() as u8);
        out.extend_from_slice(self.guest.as_bytes());
    }
}

/// A whole discovery message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MessageRepr {
    /// What the message asks or tells.
    pub(crate) kind: AnnounceKind,
    /// Generation of the sender's guest list (changes whenever the list does).
    pub(crate) generation: u32,
    /// How long to keep the sender's guests without news, in milliseconds.
    pub(crate) ttl_ms: u32,
    /// This message's position in its generation, from 0.
    pub(crate) fragment: u8,
    /// Messages the generation takes (at least 1).
    pub(crate) fragments: u8,
    /// The sender's host name.
    pub(crate) host_name: String,
    /// The guests this message carries (none in an [`AnnounceKind::Solicit`]).
    pub(crate) entries: Vec<EntryRepr>,
}

impl MessageRepr {
    /// Read and validate a message.
    pub(crate) fn parse<T: AsRef<[u8]>>(packet: &MessagePacket<T>) -> Result<MessageRepr> {
        if packet.magic() != MAGIC {
            return Err(Error::Unknown {
                what: "discovery magic",
                value: packet.magic(),
            });
        }
        if packet.version() != VERSION {
            return Err(Error::Unknown {
                what: "discovery version",
                value: u32::from(packet.version()),
            });
        }
        let kind = AnnounceKind::from_u8(packet.kind())?;
        if packet.fragments() == 0 || packet.fragment() >= packet.fragments() {
            return Err(Error::Invalid {
                field: "fragment",
                reason: "outside its generation",
            });
        }
        let host_name = std::str::from_utf8(packet.host_name())
            .ok()
            .filter(|n| names::check_host_name(n).is_ok())
            .ok_or(Error::Invalid {
                field: "host name",
                reason: "not a host name",
            })?
            .to_owned();
        let mut rest = packet.entries_bytes();
        let mut entries = Vec::with_capacity(usize::from(packet.entry_count()));
        for _ in 0..packet.entry_count() {
            let (entry, len) = EntryRepr::parse(rest)?;
            rest = rest.get(len..).unwrap_or(&[]);
            entries.push(entry);
        }
        if kind == AnnounceKind::Solicit && !entries.is_empty() {
            return Err(Error::Invalid {
                field: "entries",
                reason: "a solicitation carries none",
            });
        }
        Ok(MessageRepr {
            kind,
            generation: packet.generation(),
            ttl_ms: packet.ttl_ms(),
            fragment: packet.fragment(),
            fragments: packet.fragments(),
            host_name,
            entries,
        })
    }

    /// Bytes the message occupies.
    pub(crate) fn buffer_len(&self) -> usize {
        field::HOST_NAME
            + self.host_name.len()
            + self
                .entries
                .iter()
                .map(EntryRepr::buffer_len)
                .sum::<usize>()
    }

    /// The message's bytes, after checking every field fits its encoding.
    pub(crate) fn to_bytes(&self) -> Result<Vec<u8>> {
        names::check_host_name(&self.host_name).map_err(|_| Error::Invalid {
            field: "host name",
            reason: "not a host name",
        })?;
        if self.fragments == 0 || self.fragment >= self.fragments {
            return Err(Error::Invalid {
                field: "fragment",
                reason: "outside its generation",
            });
        }
        let count = u8::try_from(self.entries.len()).map_err(|_| Error::Invalid {
            field: "entries",
            reason: "more than 255 in one message",
        })?;
        for e in &self.entries {
            e.validate()?;
        }
        let len = self.buffer_len();
        if len > MESSAGE_LEN_MAX {
            return Err(Error::BufferTooSmall {
                needed: len,
                have: MESSAGE_LEN_MAX,
            });
        }
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&MAGIC.to_be_bytes());
        out.push(VERSION);
        out.push(self.kind as u8);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.generation.to_be_bytes());
        out.extend_from_slice(&self.ttl_ms.to_be_bytes());
        out.push(self.fragment);
        out.push(self.fragments);
        out.push(count);
        out.push(self.host_name.len() as u8);
        out.extend_from_slice(self.host_name.as_bytes());
        for e in &self.entries {
            e.emit(&mut out);
        }
        Ok(out)
    }
}

/// Split `entries` into messages of one generation, each within a RAW frame.
pub(crate) fn announcements(
    host_name: &str,
    generation: u32,
    ttl_ms: u32,
    entries: &[EntryRepr],
) -> Result<Vec<MessageRepr>> {
    let room = MESSAGE_LEN_MAX
        .saturating_sub(field::HOST_NAME)
        .saturating_sub(host_name.len());
    let mut groups: Vec<Vec<EntryRepr>> = vec![Vec::new()];
    let mut used = 0;
    for e in entries {
        let len = e.buffer_len();
        if len > room {
            return Err(Error::BufferTooSmall {
                needed: len,
                have: room,
            });
        }
        let full = groups
            .last()
            .is_some_and(|g| g.len() == usize::from(u8::MAX));
        if used + len > room || full {
            groups.push(Vec::new());
            used = 0;
        }
        used += len;
        if let Some(g) = groups.last_mut() {
            g.push(e.clone());
        }
    }
    let fragments = u8::try_from(groups.len()).map_err(|_| Error::Invalid {
        field: "fragments",
        reason: "guest list too long for 255 messages",
    })?;
    Ok(groups
        .into_iter()
        .enumerate()
        .map(|(i, entries)| MessageRepr {
            kind: AnnounceKind::Announce,
            generation,
            ttl_ms,
            fragment: i as u8,
            fragments,
            host_name: host_name.to_owned(),
            entries,
        })
        .collect())
}

/// A solicitation from `host_name`.
pub(crate) fn solicitation(host_name: &str, ttl_ms: u32) -> MessageRepr {
    MessageRepr {
        kind: AnnounceKind::Solicit,
        generation: 0,
        ttl_ms,
        fragment: 0,
        fragments: 1,
        host_name: host_name.to_owned(),
        entries: Vec::new(),
    }
}

/// A whole MXoE frame carrying `message` from `src` to `dst`.
pub(crate) fn frame(src: Mac, dst: Mac, message: &MessageRepr) -> Result<Vec<u8>> {
    let payload = message.to_bytes()?;
    FrameRepr {
        head: HeadRepr {
            dst,
            src,
            dst_src_peer_index: NO_INDEX,
        },
        packet: PacketRepr::Raw(RawRepr { payload: &payload }),
    }
    .to_vec()
}

/// The sender and message of a frame, if it is a discovery frame.
pub(crate) fn parse_frame(frame: &[u8]) -> Result<(Mac, MessageRepr)> {
    let parsed = FrameRepr::parse(frame)?;
    let PacketRepr::Raw(raw) = parsed.packet else {
        return Err(Error::Unknown {
            what: "packet type for discovery",
            value: u32::from(frame.get(HEAD_LEN).copied().unwrap_or(0)),
        });
    };
    let packet = MessagePacket::new_checked(raw.payload)?;
    Ok((parsed.head.src, MessageRepr::parse(&packet)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(i: u16, guest: &str) -> EntryRepr {
        EntryRepr {
            index: Some(i),
            since: 1_700_000_000 + u32::from(i),
            mac: names::guest_mac(guest),
            cluster: names::cluster_id("blue"),
            cluster_name: "blue".into(),
            guest: guest.into(),
        }
    }

    #[test]
    fn a_message_has_the_documented_layout() {
        let msg = MessageRepr {
            kind: AnnounceKind::Announce,
            generation: 0x0102_0304,
            ttl_ms: 8000,
            fragment: 0,
            fragments: 1,
            host_name: "h0".into(),
            entries: vec![EntryRepr {
                index: Some(5),
                since: 0x0a0b_0c0d,
                mac: Mac([6, 1, 2, 3, 4, 5]),
                cluster: 7,
                cluster_name: "c".into(),
                guest: "vm".into(),
            }],
        };
        let bytes = msg.to_bytes().unwrap();
        let want: Vec<u8> = [
            &[0x58, 0x4d, 0x58, 0x44, 1, 1, 0, 0][..],
            &[1, 2, 3, 4, 0, 0, 0x1f, 0x40],
            &[0, 1, 1, 2, b'h', b'0'],
            &[0, 5, 0x0a, 0x0b, 0x0c, 0x0d, 6, 1, 2, 3, 4, 5, 0, 0, 0, 7],
            &[1, b'c', 2, b'v', b'm'],
        ]
        .concat();
        assert_eq!(bytes, want);
        assert_eq!(bytes.len(), msg.buffer_len());
        let view = MessagePacket::new_checked(&bytes[..]).unwrap();
        assert_eq!(view.magic(), MAGIC);
        assert_eq!(view.generation(), 0x0102_0304);
        assert_eq!(view.host_name(), b"h0");
        assert_eq!(MessageRepr::parse(&view).unwrap(), msg);
    }

    #[test]
    fn padding_after_the_entries_is_ignored() {
        let msg = announcements("h1", 9, 1000, &[entry(1, "a")])
            .unwrap()
            .remove(0);
        let mut bytes = msg.to_bytes().unwrap();
        bytes.extend_from_slice(&[0; 40]);
        let back = MessageRepr::parse(&MessagePacket::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn malformed_messages_are_refused_with_typed_errors() {
        let good = announcements("h1", 9, 1000, &[entry(1, "a")])
            .unwrap()
            .remove(0);
        let bytes = good.to_bytes().unwrap();
        let parse = |b: &[u8]| MessagePacket::new_checked(b).and_then(|p| MessageRepr::parse(&p));
        for cut in 0..bytes.len() {
            assert!(
                matches!(parse(&bytes[..cut]), Err(Error::Truncated { .. })),
                "cut at {cut}"
            );
        }
        let mut bad = bytes.clone();
        bad[0] ^= 1;
        assert!(matches!(
            parse(&bad),
            Err(Error::Unknown {
                what: "discovery magic",
                ..
            })
        ));
        let mut bad = bytes.clone();
        bad[field::VERSION] = 2;
        assert!(matches!(
            parse(&bad),
            Err(Error::Unknown {
                what: "discovery version",
                ..
            })
        ));
        let mut bad = bytes.clone();
        bad[field::KIND] = 9;
        assert!(matches!(parse(&bad), Err(Error::Unknown { .. })));
        let mut bad = bytes.clone();
        bad[field::FRAGMENT] = 1;
        assert!(matches!(
            parse(&bad),
            Err(Error::Invalid {
                field: "fragment",
                ..
            })
        ));
        let mut bad = bytes.clone();
        bad[field::HOST_NAME] = b' ';
        assert!(matches!(
            parse(&bad),
            Err(Error::Invalid {
                field: "host name",
                ..
            })
        ));
        // The entry's MAC made multicast.
        let mac_at = field::HOST_NAME + 2 + field::entry::MAC.start;
        let mut bad = bytes.clone();
        bad[mac_at] |= 1;
        assert!(matches!(
            parse(&bad),
            Err(Error::Invalid {
                field: "guest MAC",
                ..
            })
        ));
        // A guest name with a slash.
        let mut bad = bytes.clone();
        let last = bad.len() - 1;
        bad[last] = b'/';
        assert!(matches!(
            parse(&bad),
            Err(Error::Invalid {
                field: "guest name",
                ..
            })
        ));
        // A solicitation with entries.
        let mut bad = bytes;
        bad[field::KIND] = AnnounceKind::Solicit as u8;
        assert!(matches!(
            parse(&bad),
            Err(Error::Invalid {
                field: "entries",
                ..
            })
        ));
    }

    #[test]
    fn long_lists_are_fragmented_within_raw_frames() {
        let entries: Vec<EntryRepr> = (0..100)
            .map(|i| entry(i, &format!("{}-{i}", "g".repeat(50))))
            .collect();
        let msgs = announcements(&"h".repeat(63), 77, 500, &entries).unwrap();
        assert!(msgs.len() > 1);
        let mut back = Vec::new();
        for (i, m) in msgs.iter().enumerate() {
            assert_eq!(usize::from(m.fragment), i);
            assert_eq!(usize::from(m.fragments), msgs.len());
            let f = frame(Mac([2, 0, 0, 0, 0, 1]), Mac::BROADCAST, m).unwrap();
            assert!(f.len() <= xmx_wire::mxoe::RAW_FRAME_LEN_MAX, "{}", f.len());
            let (src, parsed) = parse_frame(&f).unwrap();
            assert_eq!(src, Mac([2, 0, 0, 0, 0, 1]));
            assert_eq!(&parsed, m);
            back.extend(parsed.entries);
        }
        assert_eq!(back, entries);
        // An empty list is one message with no entries.
        let empty = announcements("h", 1, 1, &[]).unwrap();
        assert_eq!(empty.len(), 1);
        assert!(empty[0].entries.is_empty());
    }

    #[test]
    fn other_frames_are_not_discovery_frames() {
        let tiny = [&[0xff; 6][..], &[2, 0, 0, 0, 0, 1], &[0x86, 0xdf, 0, 0, 37]].concat();
        assert!(parse_frame(&tiny).is_err());
        let raw_other = FrameRepr {
            head: HeadRepr {
                dst: Mac::BROADCAST,
                src: Mac([2, 0, 0, 0, 0, 1]),
                dst_src_peer_index: 0,
            },
            packet: PacketRepr::Raw(RawRepr { payload: b"mapper" }),
        }
        .to_vec()
        .unwrap();
        assert!(parse_frame(&raw_other).is_err());
    }

    #[test]
    fn encoding_refuses_values_that_do_not_fit() {
        let mut m = solicitation("h", 1);
        m.host_name = String::new();
        assert!(m.to_bytes().is_err());
        let mut e = entry(1, "a");
        e.index = Some(NO_INDEX);
        assert!(announcements("h", 1, 1, &[e]).unwrap()[0]
            .to_bytes()
            .is_err());
        let mut e = entry(1, "a");
        e.cluster_name = "x".repeat(33);
        assert!(announcements("h", 1, 1, &[e]).unwrap()[0]
            .to_bytes()
            .is_err());
    }

    proptest! {
        #[test]
        fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let _ = MessagePacket::new_checked(&bytes[..]).and_then(|p| MessageRepr::parse(&p));
            let _ = parse_frame(&bytes);
        }

        #[test]
        fn messages_round_trip(
            gen in any::<u32>(),
            ttl in any::<u32>(),
            items in proptest::collection::vec(
                (proptest::option::of(0u16..0xffff), any::<u32>(), "[a-z0-9]{1,64}", "[a-z]{1,32}", any::<u32>()),
                0..40),
        ) {
            let entries: Vec<EntryRepr> = items.into_iter().map(|(index, since, guest, cluster_name, cluster)| EntryRepr {
                index, since, mac: names::guest_mac(&guest), cluster, cluster_name, guest,
            }).collect();
            let msgs = announcements("host", gen, ttl, &entries).unwrap();
            let mut back = Vec::new();
            for m in &msgs {
                let bytes = m.to_bytes().unwrap();
                prop_assert!(bytes.len() <= MESSAGE_LEN_MAX);
                let parsed = MessageRepr::parse(&MessagePacket::new_checked(&bytes[..]).unwrap()).unwrap();
                prop_assert_eq!(&parsed, m);
                back.extend(parsed.entries);
            }
            prop_assert_eq!(back, entries);
        }
    }
}
