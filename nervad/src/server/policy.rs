//! Who may connect: a peer's `SO_PEERCRED` uid/gid against the daemon's access policy.
//!
//! The kernel fills `SO_PEERCRED` at `connect(2)` time, so the check cannot be spoofed by the
//! peer; it is the only identity we trust (anything the peer writes is input, not identity).

use std::fmt;

/// Credentials of a connected peer, as the kernel reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// Process id at connect time.
    pub pid: i32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// The access policy: a peer is admitted when its uid or its gid is listed.
///
/// The default (no explicit lists) admits the daemon's own uid and the socket's group, which
/// matches the socket file's 0660 mode: whoever can open the socket file may also talk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessPolicy {
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl AccessPolicy {
    /// A policy from explicit lists. Empty lists fall back to `default_uid` / `default_gid`
    /// respectively only when *both* are empty, so `--allow-uid 1000` alone means exactly uid 1000.
    pub fn new(uids: &[u32], gids: &[u32], default_uid: u32, default_gid: u32) -> Self {
        if uids.is_empty() && gids.is_empty() {
            AccessPolicy {
                uids: vec![default_uid],
                gids: vec![default_gid],
            }
        } else {
            AccessPolicy {
                uids: uids.to_vec(),
                gids: gids.to_vec(),
            }
        }
    }

    /// Whether `peer` may connect.
    pub fn admits(&self, peer: &PeerCredentials) -> bool {
        self.uids.contains(&peer.uid) || self.gids.contains(&peer.gid)
    }
}

impl fmt::Display for AccessPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uids {:?} gids {:?}", self.uids, self.gids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32) -> PeerCredentials {
        PeerCredentials { pid: 1, uid, gid }
    }

    #[test]
    fn default_admits_own_uid_and_socket_group_only() {
        let p = AccessPolicy::new(&[], &[], 1000, 50);
        assert!(p.admits(&peer(1000, 1)));
        assert!(p.admits(&peer(7, 50)));
        assert!(!p.admits(&peer(7, 8)));
    }

    #[test]
    fn explicit_lists_replace_the_default() {
        let p = AccessPolicy::new(&[42], &[], 0, 0);
        assert!(p.admits(&peer(42, 9)));
        assert!(!p.admits(&peer(0, 0)));
        let g = AccessPolicy::new(&[], &[7], 0, 0);
        assert!(g.admits(&peer(5, 7)));
        assert!(!g.admits(&peer(0, 0)));
    }
}
