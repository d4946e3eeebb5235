//! Setup `tcp`: TCP over the same veth, the baseline most applications would use instead.
//!
//! Each message travels as a 4-byte little-endian length and the payload, written with one
//! vectored write (TCP_NODELAY, so a ping leaves at once). The reader buffers, so a stream
//! of small messages costs few system calls. Addresses are on the veth, in the benchmark
//! range 198.18.0.0/15 (RFC 2544) that the namespaces own.

use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::exchange::Channel;

/// Address of end A (the client) on a bench-made veth pair.
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
/// Address of end B (the server) on a bench-made veth pair.
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 2);
/// Prefix length of those addresses.
pub const PREFIX_LEN: u8 = 24;
/// How long a client keeps retrying to connect, and the longest wait for any read.
const TIMEOUT: Duration = Duration::from_secs(10);
const READ_BUFFER: usize = 256 << 10;

/// A TCP connection carrying length-prefixed messages.
pub struct TcpChannel {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl TcpChannel {
    fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        let writer = stream.try_clone()?;
        Ok(Self {
            reader: BufReader::with_capacity(READ_BUFFER, stream),
            writer,
        })
    }

    /// Server end: accept one connection on `listener`.
    pub fn accept(listener: &TcpListener) -> io::Result<Self> {
        let (stream, _) = listener.accept()?;
        Self::new(stream)
    }

    /// Client end: connect to `addr`, retrying while the server is not listening yet.
    pub fn connect(addr: SocketAddr) -> io::Result<Self> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match TcpStream::connect_timeout(&addr, TIMEOUT) {
                Ok(s) => return Self::new(s),
                Err(e)
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        && Instant::now() < deadline =>
                {
                    std::thread::yield_now();
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Write every byte of `bufs` with vectored writes.
fn write_all_vectored(w: &mut impl Write, bufs: &mut [&[u8]]) -> io::Result<()> {
    let mut first = 0;
    while first < bufs.len() {
        let slices: Vec<IoSlice<'_>> = bufs[first..].iter().map(|b| IoSlice::new(b)).collect();
        let mut n = match w.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while first < bufs.len() && n >= bufs[first].len() {
            n -= bufs[first].len();
            first += 1;
        }
        if first < bufs.len() {
            bufs[first] = &bufs[first][n..];
        }
    }
    Ok(())
}

impl Channel for TcpChannel {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        let len = u32::try_from(msg.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "message longer than 4 GiB"))?
            .to_le_bytes();
        write_all_vectored(&mut self.writer, &mut [&len, msg])
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut len = [0u8; 4];
        self.reader.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        let dst = buf.get_mut(..len).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("tcp: message of {len} bytes does not fit"),
            )
        })?;
        self.reader.read_exact(dst)?;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_writes_survive_short_writes() {
        /// Takes at most 3 bytes per call.
        struct Trickle(Vec<u8>);
        impl Write for Trickle {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                let n = b.len().min(3);
                self.0.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut t = Trickle(Vec::new());
        write_all_vectored(&mut t, &mut [b"abcd", b"", b"efghij"]).unwrap();
        assert_eq!(t.0, b"abcdefghij");
    }

    #[test]
    fn messages_over_loopback() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut s = TcpChannel::accept(&listener).unwrap();
            let mut buf = vec![0u8; 100_000];
            let mut got = Vec::new();
            for _ in 0..3 {
                let n = s.recv(&mut buf).unwrap();
                got.push(buf[..n].to_vec());
            }
            // Too long for the receiver's buffer.
            let mut small = [0u8; 2];
            let err = s.recv(&mut small).unwrap_err();
            (got, err.kind())
        });
        let mut c = TcpChannel::connect(addr).unwrap();
        c.send(b"").unwrap();
        c.send(b"ping").unwrap();
        c.send(&vec![7u8; 100_000]).unwrap();
        c.send(b"xyz").unwrap();
        let (got, kind) = t.join().unwrap();
        assert_eq!(got[0], b"");
        assert_eq!(got[1], b"ping");
        assert_eq!(got[2], vec![7u8; 100_000]);
        assert_eq!(kind, io::ErrorKind::InvalidData);
    }
}
