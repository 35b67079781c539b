//! Connecting: the socket, the handshake, and mapping the segment the daemon passes back.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nerva_rings::handshake::{
    ABI_VERSION, HandshakeStatus, Hello, WELCOME_FDS, WELCOME_LEN, Welcome,
};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr, connect, recvmsg,
    sendmsg, socket,
};

use crate::error::{Error, Result};

/// The default socket path: `$XDG_RUNTIME_DIR/nerva/nervad.sock`, else `/run/nerva/nervad.sock`
/// (the daemon's default too). `NERVA_SOCKET` overrides both.
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("NERVA_SOCKET")
        && !p.is_empty()
    {
        return PathBuf::from(p);
    }
    nerva_rings::handshake::default_socket_path()
}

/// Sizes a client may ask for; zero means the daemon's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingSizes {
    /// Submission ring entries (power of two) or 0.
    pub sq_entries: u32,
    /// Completion ring entries (power of two) or 0.
    pub cq_entries: u32,
    /// Input region bytes or 0.
    pub data_bytes: u64,
}

/// A live handshake's result: the socket (liveness), the mapped segment and the doorbells.
pub(crate) struct Connection {
    pub socket: OwnedFd,
    /// The segment memfd, checked: sealed, and exactly `welcome.segment_bytes` long.
    pub map_fd: OwnedFd,
    pub sq_doorbell: OwnedFd,
    pub cq_doorbell: OwnedFd,
    pub welcome: Welcome,
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) fn connect_to(path: &Path, sizes: RingSizes) -> Result<Connection> {
    let addr = UnixAddr::new(path)
        .map_err(|e| Error::InvalidArgument(format!("socket path {}: {e}", path.display())))?;
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    connect(sock.as_raw_fd(), &addr).map_err(|e| Error::NoDaemon {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let hello = Hello {
        sq_entries: sizes.sq_entries,
        cq_entries: sizes.cq_entries,
        data_bytes: sizes.data_bytes,
        ..Hello::new()
    };
    let bytes = hello.encode();
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(&bytes)],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;

    let mut pfd = [PollFd::new(
        std::os::fd::AsFd::as_fd(&sock),
        PollFlags::POLLIN,
    )];
    let timeout = PollTimeout::try_from(HANDSHAKE_TIMEOUT).unwrap_or(PollTimeout::MAX);
    if poll(&mut pfd, timeout)? == 0 {
        return Err(Error::Timeout);
    }
    let mut buf = [0u8; WELCOME_LEN + 1];
    let mut cmsg = nix::cmsg_space!([RawFd; WELCOME_FDS]);
    let (n, fds, truncated) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        for c in msg
            .cmsgs()
            .map_err(|e| Error::Protocol(format!("control message: {e}")))?
        {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: SCM_RIGHTS installed these descriptors in our table just now;
                    // we are their only owner.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        let truncated = msg
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
        (msg.bytes, fds, truncated)
    };
    if n == 0 {
        return Err(Error::DaemonGone);
    }
    if truncated {
        return Err(Error::Protocol("welcome message truncated".into()));
    }
    let welcome = Welcome::decode(&buf[..n]).map_err(|e| Error::Protocol(e.to_string()))?;
    match welcome.status {
        HandshakeStatus::Accepted => {}
        HandshakeStatus::PermissionDenied => {
            return Err(Error::PermissionDenied(welcome.message_text()));
        }
        HandshakeStatus::VersionMismatch => {
            return Err(Error::VersionMismatch {
                client: ABI_VERSION,
                daemon: welcome.abi_version,
            });
        }
        HandshakeStatus::BadRequest => {
            return Err(Error::InvalidArgument(welcome.message_text()));
        }
        HandshakeStatus::TooManyClients => {
            return Err(Error::TooManyClients(welcome.message_text()));
        }
        HandshakeStatus::ShuttingDown => return Err(Error::ShuttingDown),
        HandshakeStatus::ResourceExhausted => {
            return Err(Error::ResourceExhausted(welcome.message_text()));
        }
    }
    if welcome.abi_version != ABI_VERSION {
        return Err(Error::VersionMismatch {
            client: ABI_VERSION,
            daemon: welcome.abi_version,
        });
    }
    let [segment, sq_doorbell, cq_doorbell]: [OwnedFd; WELCOME_FDS] =
        fds.try_into().map_err(|v: Vec<OwnedFd>| {
            Error::Protocol(format!(
                "welcome carried {} descriptors, expected 3",
                v.len()
            ))
        })?;
    check_segment(&segment, welcome.segment_bytes)?;
    Ok(Connection {
        socket: sock,
        map_fd: segment,
        sq_doorbell,
        cq_doorbell,
        welcome,
    })
}

/// Check the daemon's memfd cannot shrink under us (a shrink would turn our next access into
/// SIGBUS) and that its size is what the welcome says.
fn check_segment(fd: &OwnedFd, segment_bytes: u64) -> Result<()> {
    let seals = fcntl(fd, FcntlArg::F_GET_SEALS)
        .map_err(|e| Error::Protocol(format!("segment is not a sealable memfd: {e}")))?;
    let need = (SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW).bits();
    if seals & need != need {
        return Err(Error::Protocol(
            "segment is not sealed against resizing".into(),
        ));
    }
    let actual = nix::sys::stat::fstat(fd)?.st_size;
    if u64::try_from(actual).ok() != Some(segment_bytes) || segment_bytes == 0 {
        return Err(Error::Protocol(format!(
            "segment is {actual} bytes, welcome says {segment_bytes}"
        )));
    }
    Ok(())
}
