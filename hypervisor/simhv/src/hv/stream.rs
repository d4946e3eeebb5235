//! The migration stream: one file per round, written by `save` on the source host and
//! applied by `restore` on the destination, as Xen's save/restore stream carries a domain
//! between hosts.
//!
//! Why a file and not the admin socket: a round carries up to the whole memory of the
//! domain (1 GiB by default), binary pages that JSON lines would inflate by a third and
//! that exceed the control sockets' line bound by far. The daemons of a simulated cluster
//! run as one user on one machine and share its file systems (network namespaces do not
//! separate them), so the orchestrator names a file in a directory of its own, the source
//! writes it, the destination reads it, and the admin requests stay small. A real
//! migration would send the same records over a connection.
//!
//! Layout (little-endian): the magic `XMXSAVE1`, then records `kind u32 | len u32 |
//! payload[len]`:
//! - `MEMORY` (1): `extent u32 | limit_frames u32`: frames below `extent` are the memory
//!   the stream mirrors (frames ever handed out on the source); first, once.
//! - `PAGE` (2): `frame u32 | data[PAGE_SIZE]`: the content of one frame below `extent`.
//! - `GRANTS` (3): `count u32`, then `count` entries `ref u32 | frame u32 | domid u16 |
//!   flags u16`, the grant-table entries in use (the last round only, at most once).
//! - `END` (0): empty, last; a stream without it is cut short and refused.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};

use xmx_hv::{DomId, Error, GrantRef, Result, PAGE_SIZE};

const MAGIC: &[u8; 8] = b"XMXSAVE1";
const KIND_END: u32 = 0;
const KIND_MEMORY: u32 = 1;
const KIND_PAGE: u32 = 2;
const KIND_GRANTS: u32 = 3;
const GRANT_LEN: usize = 12;

/// One grant-table entry in use, as the stream carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GrantRecord {
    pub gref: GrantRef,
    pub frame: u32,
    pub domid: DomId,
    pub flags: u16,
}

/// Writes one round.
pub(crate) struct StreamWriter {
    out: BufWriter<File>,
    bytes: u64,
}

impl StreamWriter {
    /// Start a stream in `file` (new and empty).
    pub(crate) fn new(file: File) -> io::Result<StreamWriter> {
        let mut w = StreamWriter {
            out: BufWriter::with_capacity(1 << 16, file),
            bytes: 0,
        };
        w.put(MAGIC)?;
        Ok(w)
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.bytes += b.len() as u64;
        Ok(())
    }

    fn record(&mut self, kind: u32, len: usize) -> io::Result<()> {
        let len = u32::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "record too long"))?;
        self.put(&kind.to_le_bytes())?;
        self.put(&len.to_le_bytes())
    }

    /// The `MEMORY` record.
    pub(crate) fn memory(&mut self, extent: u32, limit_frames: u32) -> io::Result<()> {
        self.record(KIND_MEMORY, 8)?;
        self.put(&extent.to_le_bytes())?;
        self.put(&limit_frames.to_le_bytes())
    }

    /// A `PAGE` record.
    pub(crate) fn page(&mut self, frame: u32, data: &[u8]) -> io::Result<()> {
        debug_assert_eq!(data.len(), PAGE_SIZE);
        self.record(KIND_PAGE, 4 + data.len())?;
        self.put(&frame.to_le_bytes())?;
        self.put(data)
    }

    /// The `GRANTS` record.
    pub(crate) fn grants(&mut self, grants: &[GrantRecord]) -> io::Result<()> {
        let count = u32::try_from(grants.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many grants"))?;
        self.record(KIND_GRANTS, 4 + grants.len() * GRANT_LEN)?;
        self.put(&count.to_le_bytes())?;
        for g in grants {
            self.put(&g.gref.to_le_bytes())?;
            self.put(&g.frame.to_le_bytes())?;
            self.put(&g.domid.to_le_bytes())?;
            self.put(&g.flags.to_le_bytes())?;
        }
        Ok(())
    }

    /// The `END` record; returns the stream's length in bytes.
    pub(crate) fn end(mut self) -> io::Result<u64> {
        self.record(KIND_END, 0)?;
        self.out.flush()?;
        Ok(self.bytes)
    }
}

/// A record read by [`StreamReader::next`]; a page's data is in the reader's buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StreamRecord {
    Memory { extent: u32, limit_frames: u32 },
    Page { frame: u32 },
    Grants(Vec<GrantRecord>),
    End,
}

/// Reads and checks one round; every malformation is an [`Error::Invalid`].
pub(crate) struct StreamReader<R> {
    input: BufReader<R>,
    page: Vec<u8>,
    /// Grant records accepted at most (the destination's table size).
    max_grants: usize,
    ended: bool,
}

fn cut_short() -> Error {
    Error::Invalid("the migration stream ends before its END record".into())
}

impl<R: Read> StreamReader<R> {
    /// Check the magic of the stream in `input`.
    pub(crate) fn new(input: R, max_grants: usize) -> Result<StreamReader<R>> {
        let mut r = StreamReader {
            input: BufReader::with_capacity(1 << 16, input),
            page: vec![0u8; PAGE_SIZE],
            max_grants,
            ended: false,
        };
        let mut magic = [0u8; 8];
        r.fill(&mut magic)?;
        if &magic != MAGIC {
            return Err(Error::Invalid("not a migration stream (bad magic)".into()));
        }
        Ok(r)
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<()> {
        self.input.read_exact(buf).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                cut_short()
            } else {
                Error::Io(e)
            }
        })
    }

    fn u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        self.fill(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// The data of the last `Page` record.
    pub(crate) fn page(&self) -> &[u8] {
        &self.page
    }

    /// The next record; after `End`, checks that nothing follows.
    pub(crate) fn next(&mut self) -> Result<StreamRecord> {
        if self.ended {
            return Err(Error::Invalid("reading past the END record".into()));
        }
        let kind = self.u32()?;
        let len = self.u32()? as usize;
        let bad_len = |what: &str| {
            Error::Invalid(format!("migration stream: a {what} record of {len} bytes"))
        };
        match kind {
            KIND_END => {
                if len != 0 {
                    return Err(bad_len("END"));
                }
                let mut extra = [0u8; 1];
                match self.input.read(&mut extra) {
                    Ok(0) => {}
                    Ok(_) => {
                        return Err(Error::Invalid(
                            "migration stream: bytes after the END record".into(),
                        ))
                    }
                    Err(e) => return Err(Error::Io(e)),
                }
                self.ended = true;
                Ok(StreamRecord::End)
            }
            KIND_MEMORY => {
                if len != 8 {
                    return Err(bad_len("MEMORY"));
                }
                let extent = self.u32()?;
                let limit_frames = self.u32()?;
                Ok(StreamRecord::Memory {
                    extent,
                    limit_frames,
                })
            }
            KIND_PAGE => {
                if len != 4 + PAGE_SIZE {
                    return Err(bad_len("PAGE"));
                }
                let frame = self.u32()?;
                let mut page = std::mem::take(&mut self.page);
                let filled = self.fill(&mut page);
                self.page = page;
                filled?;
                Ok(StreamRecord::Page { frame })
            }
            KIND_GRANTS => {
                if len < 4 || !(len - 4).is_multiple_of(GRANT_LEN) {
                    return Err(bad_len("GRANTS"));
                }
                let count = self.u32()? as usize;
                if count != (len - 4) / GRANT_LEN || count > self.max_grants {
                    return Err(Error::Invalid(format!(
                        "migration stream: {count} grants in a record of {len} bytes \
                         (a table holds {})",
                        self.max_grants
                    )));
                }
                let mut grants = Vec::with_capacity(count);
                let mut b = [0u8; GRANT_LEN];
                for _ in 0..count {
                    self.fill(&mut b)?;
                    grants.push(GrantRecord {
                        gref: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                        frame: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
                        domid: u16::from_le_bytes([b[8], b[9]]),
                        flags: u16::from_le_bytes([b[10], b[11]]),
                    });
                }
                Ok(StreamRecord::Grants(grants))
            }
            _ => Err(Error::Invalid(format!(
                "migration stream: unknown record kind {kind}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(f: impl FnOnce(&mut StreamWriter)) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let mut w = StreamWriter::new(File::create(&path).unwrap()).unwrap();
        f(&mut w);
        let n = w.end().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(n, bytes.len() as u64);
        bytes
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<StreamRecord>> {
        let mut r = StreamReader::new(bytes, 16)?;
        let mut out = Vec::new();
        loop {
            let rec = r.next()?;
            let end = rec == StreamRecord::End;
            out.push(rec);
            if end {
                return Ok(out);
            }
        }
    }

    #[test]
    fn records_round_trip() {
        let g = GrantRecord {
            gref: 9,
            frame: 3,
            domid: 0,
            flags: 5,
        };
        let bytes = written(|w| {
            w.memory(4, 256).unwrap();
            w.page(3, &[0xab; PAGE_SIZE]).unwrap();
            w.grants(&[g]).unwrap();
        });
        assert_eq!(&bytes[..8], MAGIC);
        let mut r = StreamReader::new(&bytes[..], 16).unwrap();
        assert_eq!(
            r.next().unwrap(),
            StreamRecord::Memory {
                extent: 4,
                limit_frames: 256
            }
        );
        assert_eq!(r.next().unwrap(), StreamRecord::Page { frame: 3 });
        assert!(r.page().iter().all(|b| *b == 0xab));
        assert_eq!(r.next().unwrap(), StreamRecord::Grants(vec![g]));
        assert_eq!(r.next().unwrap(), StreamRecord::End);
        assert!(r.next().is_err());
    }

    #[test]
    fn malformed_streams_are_refused_not_trusted() {
        let good = written(|w| {
            w.memory(1, 1).unwrap();
            w.page(0, &[1; PAGE_SIZE]).unwrap();
        });
        assert!(read_all(&good).is_ok());
        // Cut anywhere: refused.
        for cut in [0, 5, 8, 12, 20, 100, good.len() - 1] {
            assert!(
                matches!(read_all(&good[..cut]), Err(Error::Invalid(_))),
                "cut at {cut}"
            );
        }
        // Trailing bytes, bad magic, unknown kinds, wrong lengths, too many grants.
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(matches!(read_all(&trailing), Err(Error::Invalid(_))));
        let mut magic = good.clone();
        magic[0] = b'Y';
        assert!(matches!(read_all(&magic), Err(Error::Invalid(_))));
        let mut kind = MAGIC.to_vec();
        kind.extend_from_slice(&7u32.to_le_bytes());
        kind.extend_from_slice(&0u32.to_le_bytes());
        assert!(matches!(read_all(&kind), Err(Error::Invalid(_))));
        let mut len = MAGIC.to_vec();
        len.extend_from_slice(&KIND_PAGE.to_le_bytes());
        len.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(read_all(&len), Err(Error::Invalid(_))));
        let many = written(|w| {
            let g = GrantRecord {
                gref: 8,
                frame: 0,
                domid: 0,
                flags: 1,
            };
            w.grants(&[g; 17]).unwrap();
        });
        assert!(matches!(read_all(&many), Err(Error::Invalid(_))));
        let mut lying = MAGIC.to_vec();
        lying.extend_from_slice(&KIND_GRANTS.to_le_bytes());
        lying.extend_from_slice(&16u32.to_le_bytes());
        lying.extend_from_slice(&5u32.to_le_bytes());
        lying.extend_from_slice(&[0; 12]);
        assert!(matches!(read_all(&lying), Err(Error::Invalid(_))));
    }
}
