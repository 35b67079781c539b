//! The acceptor thread: everything slow about a connect happens here, off the poll thread —
//! accepting, the credential and version checks, reading the hello, creating the segment and
//! its doorbells. The poll thread only assigns a slot, sends the welcome and starts serving.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use nerva_rings::EventFd;
use nerva_rings::handshake::{ABI_VERSION, HandshakeStatus, Hello, Welcome};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::client_segment::{SegmentSizes, SegmentSpec};
use super::config::ServeConfig;
use super::listener::{DaemonSocket, read_hello, send_welcome};
use super::policy::{AccessPolicy, PeerCredentials};
use super::segment::SegmentOptions;

/// A client that passed every check, with its segment ready; the poll thread takes it from here.
pub struct NewClient {
    /// The connection (liveness signal; the welcome goes out on it).
    pub conn: OwnedFd,
    /// Who it is.
    pub peer: PeerCredentials,
    /// Its segment, header written.
    pub segment: SegmentSpec,
    /// The client writes it to wake the sleeping poll thread.
    pub sq_doorbell: EventFd,
    /// The poll thread writes it to wake the client blocked in `wait`.
    pub cq_doorbell: EventFd,
}

/// State the acceptor shares with the poll thread.
pub struct AcceptorShared {
    /// Set when draining: new connects get `ShuttingDown`.
    pub shutting_down: AtomicBool,
    /// Clients registered in the poll thread's table (the poll thread keeps it current).
    pub clients: AtomicU32,
    /// Written by the poll thread to stop the acceptor.
    pub stop: EventFd,
}

/// The acceptor's owned state.
pub struct Acceptor {
    socket: DaemonSocket,
    policy: AccessPolicy,
    config: ServeConfig,
    options: SegmentOptions,
    pool: Vec<SegmentSpec>,
    default_sizes: SegmentSizes,
    shared: Arc<AcceptorShared>,
    inbox: SyncSender<NewClient>,
    inbox_bell: Arc<EventFd>,
    pid: u32,
}

const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

impl Acceptor {
    /// Build the acceptor and pre-create its pool of default-sized segments (an arena: fails
    /// the daemon's start if even these cannot be had).
    pub fn new(
        socket: DaemonSocket,
        policy: AccessPolicy,
        config: ServeConfig,
        shared: Arc<AcceptorShared>,
        inbox: SyncSender<NewClient>,
        inbox_bell: Arc<EventFd>,
    ) -> io::Result<Acceptor> {
        let options = SegmentOptions {
            try_hugetlb: config.hugetlb,
            mlock: config.mlock,
        };
        let default_sizes = SegmentSizes {
            sq_entries: config.sq_entries,
            cq_entries: config.cq_entries,
            input_bytes: config.data_bytes,
            output_bytes: config.reply_bytes,
        };
        let mut pool = Vec::with_capacity(config.segment_pool as usize);
        for _ in 0..config.segment_pool {
            pool.push(SegmentSpec::create(default_sizes, options)?);
        }
        Ok(Acceptor {
            socket,
            policy,
            config,
            options,
            pool,
            default_sizes,
            shared,
            inbox,
            inbox_bell,
            pid: std::process::id(),
        })
    }

    /// Page backing of the pooled segments, for the startup log and status.
    pub fn pool_report(&self) -> Option<(&'static str, u64, bool)> {
        self.pool
            .first()
            .map(|s| (s.backing.name(), s.page_bytes, s.locked))
    }

    /// Serve connects until the stop eventfd fires.
    pub fn run(mut self) {
        loop {
            let mut fds = [
                PollFd::new(self.socket.fd(), PollFlags::POLLIN),
                PollFd::new(self.shared.stop.as_fd(), PollFlags::POLLIN),
            ];
            // Refill the pool while idle (wake every 100 ms at most when short).
            let timeout = if self.pool.len() < self.config.segment_pool as usize {
                PollTimeout::from(100u16)
            } else {
                PollTimeout::NONE
            };
            match poll(&mut fds, timeout) {
                Ok(0) => {
                    self.refill_one();
                    continue;
                }
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "acceptor poll failed; no more connects");
                    return;
                }
            }
            let stop = fds[1].revents().is_some_and(|r| !r.is_empty());
            let ready = fds[0]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLIN));
            if stop {
                return;
            }
            if ready {
                self.accept_one();
            }
        }
    }

    fn refill_one(&mut self) {
        if self.pool.len() < self.config.segment_pool as usize {
            match SegmentSpec::create(self.default_sizes, self.options) {
                Ok(s) => self.pool.push(s),
                Err(e) => tracing::warn!(error = %e, "cannot refill the segment pool"),
            }
        }
    }

    fn refuse(&self, conn: &OwnedFd, peer: &PeerCredentials, status: HandshakeStatus, why: &str) {
        tracing::info!(
            pid = peer.pid,
            uid = peer.uid,
            gid = peer.gid,
            ?status,
            why,
            "connect refused"
        );
        let welcome = Welcome::refused(status, self.pid, why);
        if let Err(e) = send_welcome(conn.as_fd(), &welcome, None) {
            tracing::debug!(error = %e, "refusal not delivered");
        }
    }

    fn accept_one(&mut self) {
        let (conn, peer) = match self.socket.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                return;
            }
        };
        let hello = match read_hello(conn.as_fd(), HELLO_TIMEOUT) {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                self.refuse(
                    &conn,
                    &peer,
                    HandshakeStatus::BadRequest,
                    &format!("malformed hello: {e}"),
                );
                return;
            }
            Err(e) => {
                tracing::info!(pid = peer.pid, error = %e, "peer sent no hello");
                return;
            }
        };
        // The hello is read even from a peer we refuse: closing a socket with unread data
        // resets the connection and the peer would never see the refusal. A refused peer
        // learns nothing but the refusal.
        if !self.policy.admits(&peer) {
            self.refuse(
                &conn,
                &peer,
                HandshakeStatus::PermissionDenied,
                "uid/gid not admitted by the daemon's access policy",
            );
            return;
        }
        if hello.abi_version != ABI_VERSION {
            let why = format!(
                "daemon speaks ABI {ABI_VERSION}, client {}",
                hello.abi_version
            );
            self.refuse(&conn, &peer, HandshakeStatus::VersionMismatch, &why);
            return;
        }
        if self.shared.shutting_down.load(Ordering::Acquire) {
            self.refuse(
                &conn,
                &peer,
                HandshakeStatus::ShuttingDown,
                "daemon is shutting down",
            );
            return;
        }
        if self.shared.clients.load(Ordering::Relaxed) >= self.config.max_clients {
            self.refuse(
                &conn,
                &peer,
                HandshakeStatus::TooManyClients,
                "daemon serves --max-clients clients",
            );
            return;
        }
        let sizes = match self.sizes_for(&hello) {
            Ok(s) => s,
            Err(why) => {
                self.refuse(&conn, &peer, HandshakeStatus::BadRequest, &why);
                return;
            }
        };
        let segment = if sizes == self.default_sizes && !self.pool.is_empty() {
            self.pool
                .pop()
                .ok_or_else(|| io::Error::other("pool empty"))
        } else {
            SegmentSpec::create(sizes, self.options)
        };
        let doorbells = EventFd::new().and_then(|a| Ok((a, EventFd::new()?)));
        let (segment, (sq_doorbell, cq_doorbell)) = match (segment, doorbells) {
            (Ok(s), Ok(d)) => (s, d),
            (Err(e), _) => {
                tracing::warn!(error = %e, "segment creation failed");
                self.refuse(
                    &conn,
                    &peer,
                    HandshakeStatus::ResourceExhausted,
                    "cannot create the shared segment",
                );
                return;
            }
            (_, Err(e)) => {
                tracing::warn!(error = %e, "eventfd creation failed");
                self.refuse(
                    &conn,
                    &peer,
                    HandshakeStatus::ResourceExhausted,
                    "cannot create doorbells",
                );
                return;
            }
        };
        let client = NewClient {
            conn,
            peer,
            segment,
            sq_doorbell,
            cq_doorbell,
        };
        if self.inbox.send(client).is_err() {
            // The poll thread is gone: we are shutting down.
            return;
        }
        if let Err(e) = self.inbox_bell.signal() {
            tracing::warn!(error = %e, "cannot ring the poll thread");
        }
    }

    fn sizes_for(&self, hello: &Hello) -> Result<SegmentSizes, String> {
        let pick = |asked: u32, default: u32| if asked == 0 { default } else { asked };
        let sq = pick(hello.sq_entries, self.config.sq_entries);
        let cq = pick(hello.cq_entries, self.config.cq_entries);
        let data = if hello.data_bytes == 0 {
            self.config.data_bytes
        } else {
            hello.data_bytes
        };
        for (name, n) in [("sq_entries", sq), ("cq_entries", cq)] {
            if !n.is_power_of_two() || n < 2 || n > self.config.max_ring_entries {
                return Err(format!(
                    "{name} {n} must be a power of two in 2..={}",
                    self.config.max_ring_entries
                ));
            }
        }
        if data < 4096 || data > self.config.max_data_bytes {
            return Err(format!(
                "data_bytes {data} must be in 4096..={}",
                self.config.max_data_bytes
            ));
        }
        Ok(SegmentSizes {
            sq_entries: sq,
            cq_entries: cq,
            input_bytes: data,
            output_bytes: self.config.reply_bytes,
        })
    }
}
