//! A raw client for fault injection: it performs the handshake itself, maps its segment, and
//! then writes whatever it likes into its own rings, indices, descriptors and data area —
//! things the real client library never does. The daemon must survive all of it and keep
//! serving everyone else.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use nerva_rings::handshake::{HandshakeStatus, Hello, WELCOME_FDS, WELCOME_LEN, Welcome};
use nerva_rings::{ClientEnd, EventFd, Segment, SegmentMapping};
use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr, connect, recvmsg,
    sendmsg, socket,
};

/// A connected raw client.
pub struct RawClient {
    /// The socket (liveness).
    pub socket: OwnedFd,
    /// The mapped segment.
    pub segment: Arc<Segment>,
    /// The client's ring halves and regions (for well-formed traffic).
    pub end: ClientEnd,
    /// Submission doorbell (write to wake the daemon).
    pub sq_bell: EventFd,
    /// Completion doorbell.
    pub cq_bell: EventFd,
    /// The welcome.
    pub welcome: Welcome,
}

/// Connect without the client library. `Err` carries the refusal status, if one came.
pub fn raw_connect(path: &Path, hello: Hello) -> Result<RawClient, Option<HandshakeStatus>> {
    let addr = UnixAddr::new(path).map_err(|_| None)?;
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|_| None)?;
    connect(sock.as_raw_fd(), &addr).map_err(|_| None)?;
    let bytes = hello.encode();
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(&bytes)],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|_| None)?;
    let mut buf = [0u8; WELCOME_LEN];
    let mut cmsg = nix::cmsg_space!([RawFd; WELCOME_FDS]);
    let mut fds = Vec::new();
    let n = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|_| None)?;
        for c in msg.cmsgs().map_err(|_| None)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: SCM_RIGHTS just installed these descriptors; we own them.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        msg.bytes
    };
    let welcome = Welcome::decode(&buf[..n]).map_err(|_| None)?;
    if welcome.status != HandshakeStatus::Accepted {
        return Err(Some(welcome.status));
    }
    let [seg_fd, sq, cq]: [OwnedFd; 3] = fds.try_into().map_err(|_| None)?;
    let mapping =
        SegmentMapping::map_fd(seg_fd.as_fd(), welcome.segment_bytes as usize).map_err(|_| None)?;
    let segment = Segment::open(mapping).map_err(|_| None)?;
    let end = segment.client_end().map_err(|_| None)?;
    Ok(RawClient {
        socket: sock,
        segment,
        end,
        sq_bell: EventFd::from_owned(sq).map_err(|_| None)?,
        cq_bell: EventFd::from_owned(cq).map_err(|_| None)?,
        welcome,
    })
}

impl RawClient {
    /// Bytes of the segment.
    pub fn len(&self) -> usize {
        self.segment.mapping().len()
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Write `bytes` at `offset` of the segment, wrapping the offset into range.
    pub fn scribble(&self, offset: u64, bytes: &[u8]) {
        let len = self.len();
        let start = (offset as usize) % len;
        let n = bytes.len().min(len - start);
        // SAFETY: `start + n <= len`: inside our own live mapping. The daemon reads this
        // memory concurrently; that is the point of the test, and it only ever reads shared
        // memory through atomics or single copies it then validates.
        unsafe {
            let dst = self.segment.mapping().as_ptr().as_ptr().add(start);
            for (i, b) in bytes[..n].iter().enumerate() {
                dst.add(i).write_volatile(*b);
            }
        }
    }

    /// Read a u32 at `offset` (for index games).
    pub fn peek_u32(&self, offset: u64) -> u32 {
        let len = self.len();
        let start = (offset as usize) % (len - 4);
        let mut b = [0u8; 4];
        // SAFETY: `start + 4 <= len`, inside our own live mapping.
        unsafe {
            let src = self.segment.mapping().as_ptr().as_ptr().add(start);
            for (i, slot) in b.iter_mut().enumerate() {
                *slot = src.add(i).read_volatile();
            }
        }
        u32::from_ne_bytes(b)
    }

    /// Whether the daemon hung up on us.
    pub fn hung_up(&self) -> bool {
        let mut fds = [nix::poll::PollFd::new(
            self.socket.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap_or(0) > 0
    }
}
