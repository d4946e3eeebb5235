//! MEDIUM messages: splitting into fragments and putting them back together.
//!
//! In wire-compatible mode a fragment carries at most 4096 bytes and its offset
//! in the message is `frag_seqnum << frag_pipeline` with a pipeline of 12.
//! Reassembly accepts fragments in any order, ignores duplicates, and refuses
//! fragments that do not fit the message they claim to belong to.

use crate::class::MEDIUM_MAX;

/// log2 of the fragment size in wire-compatible mode.
pub const FRAG_PIPELINE: u8 = 12;
/// Largest fragment payload.
pub const FRAG_LENGTH_MAX: usize = 1 << FRAG_PIPELINE;
/// Most fragments one MEDIUM message can have.
pub const FRAGS_MAX: usize = MEDIUM_MAX.div_ceil(FRAG_LENGTH_MAX);

/// One fragment of a message: its index and the bytes it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment<'a> {
    /// Index (the wire's `frag_seqnum`).
    pub frag_seqnum: u8,
    /// Offset of the data in the message.
    pub offset: usize,
    /// The data.
    pub data: &'a [u8],
}

/// The fragments of `msg`, in order: all full size but the last. An empty
/// message still has one (empty) fragment so that it is announced.
pub fn fragments(msg: &[u8]) -> impl Iterator<Item = Fragment<'_>> + '_ {
    let count = msg.len().div_ceil(FRAG_LENGTH_MAX).max(1);
    (0..count).map(move |i| {
        let offset = i * FRAG_LENGTH_MAX;
        let end = (offset + FRAG_LENGTH_MAX).min(msg.len());
        Fragment {
            // `count` is at most FRAGS_MAX for any length the sender allows;
            // larger inputs only occur if a caller bypasses the class check.
            frag_seqnum: u8::try_from(i).unwrap_or(u8::MAX),
            offset,
            data: msg.get(offset..end).unwrap_or(&[]),
        }
    })
}

/// Why a fragment was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FragError {
    /// The message length is larger than a MEDIUM may be.
    #[error("medium length {0} exceeds the maximum")]
    MessageTooLong(u32),
    /// The pipeline (fragment size) is not the wire-compatible one.
    #[error("unsupported fragment pipeline {0}")]
    BadPipeline(u8),
    /// The fragment does not lie inside the message, or a non-final fragment
    /// is short, or it disagrees with the message's length.
    #[error("fragment {frag_seqnum} ({len} bytes) does not fit a {msg_length}-byte message")]
    OutOfBounds {
        /// Offending fragment index.
        frag_seqnum: u8,
        /// Its payload length.
        len: usize,
        /// The message length it claims.
        msg_length: u32,
    },
}

/// What [`Reassembly::insert`] did with a fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// New data stored; more fragments are missing.
    Partial,
    /// New data stored and the message is now whole.
    Complete,
    /// That fragment had already arrived; nothing changed.
    Duplicate,
}

/// Checks a fragment against its message and returns its offset.
pub fn check_fragment(
    msg_length: u32,
    frag_seqnum: u8,
    frag_pipeline: u8,
    len: usize,
) -> Result<usize, FragError> {
    let total = msg_length as usize;
    if total > MEDIUM_MAX {
        return Err(FragError::MessageTooLong(msg_length));
    }
    if frag_pipeline != FRAG_PIPELINE {
        return Err(FragError::BadPipeline(frag_pipeline));
    }
    let offset = usize::from(frag_seqnum) << FRAG_PIPELINE;
    let oob = FragError::OutOfBounds {
        frag_seqnum,
        len,
        msg_length,
    };
    let end = offset.checked_add(len).ok_or(oob)?;
    if len > FRAG_LENGTH_MAX || end > total {
        return Err(oob);
    }
    // Only the last fragment may be short, and it must end the message.
    if len < FRAG_LENGTH_MAX && end != total {
        return Err(oob);
    }
    // An empty fragment only describes an empty message.
    if len == 0 && (total != 0 || frag_seqnum != 0) {
        return Err(oob);
    }
    Ok(offset)
}

/// A MEDIUM message being put together from its fragments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reassembly {
    msg_length: u32,
    received: u32,
    accumulated: usize,
    data: Vec<u8>,
}

impl Reassembly {
    /// An empty reassembly of a `msg_length`-byte message.
    pub fn new(msg_length: u32) -> Result<Self, FragError> {
        if msg_length as usize > MEDIUM_MAX {
            return Err(FragError::MessageTooLong(msg_length));
        }
        Ok(Reassembly {
            msg_length,
            received: 0,
            accumulated: 0,
            data: vec![0; msg_length as usize],
        })
    }

    /// The message length.
    pub fn msg_length(&self) -> u32 {
        self.msg_length
    }

    /// Whether every byte has arrived.
    pub fn is_complete(&self) -> bool {
        self.received != 0 && self.accumulated == self.msg_length as usize
    }

    /// Stores one fragment.
    pub fn insert(
        &mut self,
        frag_seqnum: u8,
        frag_pipeline: u8,
        payload: &[u8],
    ) -> Result<Inserted, FragError> {
        let offset = check_fragment(self.msg_length, frag_seqnum, frag_pipeline, payload.len())?;
        // check_fragment bounds frag_seqnum to FRAGS_MAX (< 32) via the length check.
        let bit = 1u32.checked_shl(u32::from(frag_seqnum)).unwrap_or(0);
        if bit == 0 {
            return Err(FragError::OutOfBounds {
                frag_seqnum,
                len: payload.len(),
                msg_length: self.msg_length,
            });
        }
        if self.received & bit != 0 {
            return Ok(Inserted::Duplicate);
        }
        let dst =
            self.data
                .get_mut(offset..offset + payload.len())
                .ok_or(FragError::OutOfBounds {
                    frag_seqnum,
                    len: payload.len(),
                    msg_length: self.msg_length,
                })?;
        dst.copy_from_slice(payload);
        self.received |= bit;
        self.accumulated += payload.len();
        Ok(if self.is_complete() {
            Inserted::Complete
        } else {
            Inserted::Partial
        })
    }

    /// The message bytes (meaningful once complete).
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn split_sizes() {
        let msg = pattern(10000);
        let f: Vec<_> = fragments(&msg).collect();
        assert_eq!(f.len(), 3);
        assert_eq!(
            f.iter().map(|x| x.data.len()).collect::<Vec<_>>(),
            vec![4096, 4096, 1808]
        );
        assert_eq!(f[2].offset, 8192);
        assert_eq!(f[2].frag_seqnum, 2);
        assert_eq!(fragments(&pattern(MEDIUM_MAX)).count(), FRAGS_MAX);
        assert_eq!(FRAGS_MAX, 8);
        assert_eq!(fragments(&pattern(4096)).count(), 1);
        assert_eq!(fragments(&[]).count(), 1);
    }

    #[test]
    fn reassembles_any_order_with_duplicates() {
        let msg = pattern(20000);
        let frags: Vec<_> = fragments(&msg).collect();
        let mut r = Reassembly::new(20000).unwrap();
        let order = [4, 1, 1, 0, 3, 4, 2];
        let mut outcomes = Vec::new();
        for &i in &order {
            let f = frags[i];
            outcomes.push(r.insert(f.frag_seqnum, FRAG_PIPELINE, f.data).unwrap());
        }
        use Inserted::*;
        assert_eq!(
            outcomes,
            vec![Partial, Partial, Duplicate, Partial, Partial, Duplicate, Complete]
        );
        assert!(r.is_complete());
        assert_eq!(r.into_data(), msg);
    }

    #[test]
    fn refuses_misfits() {
        let mut r = Reassembly::new(5000).unwrap();
        // Non-final fragment short.
        assert!(matches!(
            r.insert(0, 12, &[0; 100]),
            Err(FragError::OutOfBounds { .. })
        ));
        // Past the end.
        assert!(matches!(
            r.insert(1, 12, &[0; 4096]),
            Err(FragError::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.insert(2, 12, &[0; 1]),
            Err(FragError::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.insert(255, 12, &[0; 1]),
            Err(FragError::OutOfBounds { .. })
        ));
        // Oversized fragment.
        assert!(matches!(
            r.insert(0, 12, &[0; 5000]),
            Err(FragError::OutOfBounds { .. })
        ));
        assert_eq!(r.insert(0, 13, &[0; 4096]), Err(FragError::BadPipeline(13)));
        assert_eq!(
            Reassembly::new(40000).unwrap_err(),
            FragError::MessageTooLong(40000)
        );
        // Nothing was stored by the refusals.
        assert_eq!(r.insert(1, 12, &[1; 904]), Ok(Inserted::Partial));
        assert_eq!(r.insert(0, 12, &[2; 4096]), Ok(Inserted::Complete));
    }

    #[test]
    fn empty_message_is_one_empty_fragment() {
        let mut r = Reassembly::new(0).unwrap();
        assert!(!r.is_complete());
        assert!(r.insert(1, 12, &[]).is_err());
        assert_eq!(r.insert(0, 12, &[]), Ok(Inserted::Complete));
        assert_eq!(r.insert(0, 12, &[]), Ok(Inserted::Duplicate));
    }
}
