//! Batched UDP I/O for the DNS workers: up to [`UDP_BATCH`] queries taken with one `recvmmsg`
//! and their answers sent with one `sendmmsg` (safe wrappers: nix's `recvmmsg`, rustix's
//! `sendmmsg`, which reports how many went), as Knot's UDP workers do. Under load a worker
//! thus pays two system calls per batch instead of two per query; when queries trickle in, a
//! batch is one query and nothing waits for a batch to fill (`MSG_WAITFORONE`: block for the
//! first datagram only, then take what is already queued).
//!
//! Each slot holds [`UDP_SLOT`] bytes. A datagram longer than that (no client sends a query that
//! large: clients advertise at most 4096 bytes of EDNS payload for the *answer*, and a question
//! fits in 512) arrives cut, which the kernel flags (`MSG_TRUNC`); it gets FORMERR rather than an
//! answer to what was left of it.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg};
use rustix::net::addr::SocketAddrArg as _;
use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags, SocketAddrAny, sendmmsg};

/// Datagrams taken (and answers sent) per system call at most.
pub const UDP_BATCH: usize = 16;
/// Bytes of each receive slot; a longer datagram is cut and answered FORMERR.
pub const UDP_SLOT: usize = 4096;

/// One received datagram: its length, whether the kernel cut it, and where it came from.
#[derive(Clone, Copy, Debug)]
pub struct Received {
    /// Bytes in the slot.
    pub len: usize,
    /// The datagram was longer than [`UDP_SLOT`] (`MSG_TRUNC`).
    pub truncated: bool,
    /// The sender, as the kernel gave it (the answer goes back to exactly this); `None` only
    /// if the kernel gave no address, and then there is no one to answer.
    pub from: Option<SockaddrStorage>,
}

impl Received {
    /// The sender's address (`None` also for an address family other than IPv4/IPv6, which a
    /// UDP socket bound to an IP address never yields).
    pub fn peer(&self) -> Option<SocketAddr> {
        let from = self.from.as_ref()?;
        if let Some(v4) = from.as_sockaddr_in() {
            Some(SocketAddr::V4((*v4).into()))
        } else {
            from.as_sockaddr_in6()
                .map(|v6| SocketAddr::V6((*v6).into()))
        }
    }
}

/// A worker's buffers: the receive slots, the received datagrams' metadata, and the answers
/// waiting to be sent. Allocated once per worker thread (`MultiHeaders` is not `Send`), so the
/// loop itself allocates nothing but the answers.
pub struct Batch {
    slots: Box<[[u8; UDP_SLOT]; UDP_BATCH]>,
    received: Vec<Received>,
    headers: MultiHeaders<SockaddrStorage>,
    answers: Vec<(Vec<u8>, SocketAddrAny)>,
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl Batch {
    /// Buffers for [`UDP_BATCH`] datagrams.
    pub fn new() -> Self {
        Self {
            slots: Box::new([[0u8; UDP_SLOT]; UDP_BATCH]),
            received: Vec::with_capacity(UDP_BATCH),
            headers: MultiHeaders::preallocate(UDP_BATCH, None),
            answers: Vec::with_capacity(UDP_BATCH),
        }
    }

    /// Wait for at least one datagram on `socket` (up to its read timeout), then take every
    /// queued one up to [`UDP_BATCH`]. Returns how many arrived; read them with [`Self::get`].
    /// The read timeout surfaces as `WouldBlock`/`TimedOut`.
    pub fn receive(&mut self, socket: &std::net::UdpSocket) -> io::Result<usize> {
        self.received.clear();
        let mut iovs = self.slots.each_mut().map(|s| [IoSliceMut::new(&mut s[..])]);
        let results = recvmmsg(
            socket.as_raw_fd(),
            &mut self.headers,
            iovs.iter_mut(),
            MsgFlags::MSG_WAITFORONE,
            None,
        )
        .map_err(io::Error::from)?;
        for msg in results {
            self.received.push(Received {
                len: msg.bytes.min(UDP_SLOT),
                truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
                from: msg.address,
            });
        }
        Ok(self.received.len())
    }

    /// Datagram `i` of the last [`Self::receive`]: its bytes and metadata.
    pub fn get(&self, i: usize) -> (&[u8], Received) {
        let r = self.received[i];
        (&self.slots[i][..r.len], r)
    }

    /// Queue an answer to `to` for the next [`Self::flush`] (at most [`UDP_BATCH`] are queued:
    /// one per received datagram).
    pub fn answer(&mut self, bytes: Vec<u8>, to: SocketAddr) {
        self.answers.push((bytes, to.as_any()));
    }

    /// Send the queued answers in as few system calls as the kernel allows. An answer the
    /// kernel refuses (e.g. an unreachable destination) is skipped; the others still go.
    /// Returns how many could not be sent.
    pub fn flush(&mut self, socket: &std::net::UdpSocket) -> usize {
        let mut failed = 0;
        let mut start = 0;
        while start < self.answers.len() {
            let pending = &self.answers[start..self.answers.len().min(start + UDP_BATCH)];
            let iovs: Vec<[IoSlice<'_>; 1]> =
                pending.iter().map(|(b, _)| [IoSlice::new(b)]).collect();
            let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = pending
                .iter()
                .map(|_| SendAncillaryBuffer::default())
                .collect();
            let mut msgs: Vec<MMsgHdr<'_>> = pending
                .iter()
                .zip(&iovs)
                .zip(controls.iter_mut())
                .map(|(((_, to), iov), control)| MMsgHdr::new_with_addr(to, iov, control))
                .collect();
            match sendmmsg(socket, &mut msgs, SendFlags::empty()) {
                Ok(n) if n > 0 => start += n,
                // The first pending answer failed: skip it and send the rest.
                Ok(_) | Err(_) => {
                    failed += 1;
                    start += 1;
                }
            }
        }
        self.answers.clear();
        failed
    }
}

#[cfg(test)]
#[path = "udp_tests.rs"]
mod tests;
