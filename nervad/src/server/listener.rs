//! The daemon's Unix socket: creation (mode, stale-socket detection), accepting peers with
//! their kernel-reported credentials, and the handshake messages with their descriptors.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nerva_rings::handshake::{HELLO_LEN, HandshakeError, Hello, WELCOME_FDS, Welcome};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr, accept4, bind,
    connect, getsockopt, listen, recvmsg, sendmsg, socket, sockopt,
};

use super::policy::PeerCredentials;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Another daemon answers on the path.
    #[error("a live daemon already answers on {0}; stop it or choose another --socket")]
    InUse(PathBuf),
    /// The path exists and is not a socket: we never delete files we did not create.
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    /// A system call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// Which step.
        what: &'static str,
        /// Which path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// The bound, listening socket. Removes its path on drop.
#[derive(Debug)]
pub struct DaemonSocket {
    fd: OwnedFd,
    path: PathBuf,
}

pub use nerva_rings::handshake::default_socket_path;

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> ListenError + 'a {
    move |e| ListenError::Io {
        what,
        path: path.to_path_buf(),
        source: io::Error::from(e),
    }
}

fn seqpacket() -> nix::Result<OwnedFd> {
    socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
}

impl DaemonSocket {
    /// Bind `path` with permissions `mode`. A leftover socket file whose daemon is gone is
    /// removed; a live one is an error. `create_dir`: create a missing parent directory (the
    /// default location); otherwise a missing directory is an error naming it.
    pub fn bind(path: &Path, mode: u32, create_dir: bool) -> Result<DaemonSocket, ListenError> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
            && !dir.is_dir()
        {
            if !create_dir {
                return Err(ListenError::Io {
                    what: "socket directory (create it, or omit --socket for the default)",
                    path: dir.to_path_buf(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
            }
            std::fs::create_dir_all(dir).map_err(|source| ListenError::Io {
                what: "create directory",
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let addr = UnixAddr::new(path).map_err(io_err("socket address", path))?;
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                let probe = seqpacket().map_err(io_err("socket", path))?;
                match connect(probe.as_raw_fd(), &addr) {
                    Ok(()) => return Err(ListenError::InUse(path.to_path_buf())),
                    Err(Errno::ECONNREFUSED) | Err(Errno::ENOENT) => {
                        tracing::info!(path = %path.display(), "removing stale socket");
                        std::fs::remove_file(path).map_err(|source| ListenError::Io {
                            what: "remove stale socket",
                            path: path.to_path_buf(),
                            source,
                        })?;
                    }
                    Err(e) => return Err(io_err("probe existing socket", path)(e)),
                }
            }
            Ok(_) => return Err(ListenError::NotASocket(path.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ListenError::Io {
                    what: "stat",
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        let fd = seqpacket().map_err(io_err("socket", path))?;
        bind(fd.as_raw_fd(), &addr).map_err(io_err("bind", path))?;
        let sock = DaemonSocket {
            fd,
            path: path.to_path_buf(),
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(
            |source| ListenError::Io {
                what: "chmod",
                path: path.to_path_buf(),
                source,
            },
        )?;
        listen(&sock.fd, Backlog::new(128).unwrap_or(Backlog::MAXCONN))
            .map_err(io_err("listen", path))?;
        Ok(sock)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The group owning the socket file (the default access policy admits it).
    pub fn group(&self) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path).map(|m| m.gid()).unwrap_or(0)
    }

    /// The listening descriptor (for poll).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Accept one pending connection (the listener is polled first, so this does not block
    /// for long), with the peer's credentials.
    pub fn accept(&self) -> io::Result<(OwnedFd, PeerCredentials)> {
        let raw = accept4(
            self.fd.as_raw_fd(),
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )?;
        // SAFETY: accept4 just returned this descriptor; nothing else owns it.
        let conn = unsafe { OwnedFd::from_raw_fd(raw) };
        let cred = getsockopt(&conn, sockopt::PeerCredentials)?;
        Ok((
            conn,
            PeerCredentials {
                pid: cred.pid(),
                uid: cred.uid(),
                gid: cred.gid(),
            },
        ))
    }
}

impl Drop for DaemonSocket {
    fn drop(&mut self) {
        // Only unlink if the path is still ours (same inode as our socket is not checkable for
        // sockets portably; a successor daemon binds only after our path is gone or stale).
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Wait up to `timeout` for the peer's [`Hello`] and decode it.
pub fn read_hello(
    conn: BorrowedFd<'_>,
    timeout: Duration,
) -> io::Result<Result<Hello, HandshakeError>> {
    let mut fds = [PollFd::new(conn, PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    if poll(&mut fds, ms)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no hello from peer",
        ));
    }
    // One byte more than a hello: a longer message is malformed, not silently truncated.
    let mut buf = [0u8; HELLO_LEN + 1];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(conn.as_raw_fd(), &mut iov, None, MsgFlags::MSG_DONTWAIT)?;
    let n = msg.bytes;
    if msg.flags.contains(MsgFlags::MSG_TRUNC) {
        return Ok(Err(HandshakeError::Length {
            got: n + 1,
            expected: HELLO_LEN,
        }));
    }
    Ok(Hello::decode(&buf[..n]))
}

/// Send `welcome`, with `fds` attached when given (exactly [`WELCOME_FDS`] on success).
pub fn send_welcome(
    conn: BorrowedFd<'_>,
    welcome: &Welcome,
    fds: Option<[RawFd; WELCOME_FDS]>,
) -> io::Result<()> {
    let bytes = welcome.encode();
    let iov = [IoSlice::new(&bytes)];
    let rights;
    let cmsgs: &[ControlMessage<'_>] = match &fds {
        Some(f) => {
            rights = [ControlMessage::ScmRights(f)];
            &rights
        }
        None => &[],
    };
    let sent = sendmsg::<()>(conn.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if sent != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short welcome"));
    }
    Ok(())
}
