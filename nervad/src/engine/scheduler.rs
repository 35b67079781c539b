//! Scheduling policy: who runs first, who is preempted when the KV pool runs dry.
//!
//! The engine (`core`) owns the mechanism (slots, pages, steps); the choices it makes are
//! written here so they can be read, and tested, on their own.
//!
//! - **Rank** orders running sequences for pages: higher request priority first, then the
//!   request admitted earlier (its admission stamp is kept across preemption, so a preempted
//!   request regains its place), then the lower sample index. A sequence that needs a page
//!   when none is left preempts the *lowest*-ranked sequence that holds pages (vLLM's
//!   policy: lowest priority, then most recently admitted), or itself when it ranks lowest.
//! - **Preemption mode** says what happens to the victim's KV pages ([`Preemption`]): copied
//!   to the host swap area and back before it runs again (swap), or freed and recomputed from
//!   its tokens (recompute). Swap falls back to recompute when the host area has no room.

//! - **Fair share** orders clients for admission and prefill: deficit round robin by tokens
//!   served (prefill and decode). Each client's deficit is the quantum it has been granted
//!   minus the tokens it was served; with a quantum of one token per round (the limit DRR
//!   tends to as the quantum shrinks, and what an LLM server can afford since a request's cost
//!   is unknown until it ends) serving the largest deficit first is serving the client with
//!   the fewest tokens served first. A client that was idle re-enters at the least-served
//!   active client's count (DRR resets an empty queue's deficit), so idling banks no credit
//!   and a flood from one client cannot starve another: its next request or prefill chunk
//!   goes first as soon as it has been served less. This is the Virtual Token Counter of
//!   Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024). Within a client,
//!   higher request priority first, then arrival order.

use std::cmp::Reverse;

use super::api::ClientId;

/// What a preempted sequence's KV pages become.
///
/// Swap is the default: it keeps the KV bits exactly (a copy), costs a page's bytes over the
/// host link each way instead of a forward pass over the whole prefix, and leaves the prefix
/// cache's pages alone. Recompute re-prefills the prefix, which on the CUDA backend runs
/// cuBLAS projections that need not reproduce the bits decode steps wrote (README, scheduling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Preemption {
    /// Copy the victim's own pages to the host swap area and back before it resumes; pages
    /// it shares stay resident. Recompute when the swap area is full (or absent).
    #[default]
    Swap,
    /// Free the victim's pages; it prefills its prefix again when it resumes.
    Recompute,
}

/// Where a sequence stands for pages: smaller runs first, the largest is the next victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank {
    priority: Reverse<u8>,
    stamp: u64,
    sample: u16,
}

impl Rank {
    /// The rank of sample `sample` of a request with `priority`, admitted `stamp`-th.
    pub fn new(priority: u8, stamp: u64, sample: u16) -> Self {
        Rank {
            priority: Reverse(priority),
            stamp,
            sample,
        }
    }
}

/// Tokens served per client, indexed by the client's server slot (bounded by the server's
/// client limit; a slot reused by a new client starts over).
#[derive(Debug, Default)]
pub struct FairShare {
    clients: Vec<ClientShare>,
}

#[derive(Debug, Clone, Copy, Default)]
struct ClientShare {
    generation: u32,
    /// Tokens served, lifted on re-entry (the order key; comparable across clients).
    counter: u64,
    /// Tokens actually served (prefill + decode) since the client connected.
    served: u64,
    /// Requests submitted and not yet finished.
    in_flight: u32,
    known: bool,
}

impl FairShare {
    fn entry(&mut self, client: ClientId) -> &mut ClientShare {
        let i = client.slot as usize;
        if i >= self.clients.len() {
            self.clients.resize(i + 1, ClientShare::default());
        }
        let e = &mut self.clients[i];
        if !e.known || e.generation != client.generation {
            *e = ClientShare {
                generation: client.generation,
                known: true,
                ..ClientShare::default()
            };
        }
        e
    }

    /// A request of `client` was accepted. A client that had nothing in flight re-enters at
    /// the least-served active client's count.
    pub fn submitted(&mut self, client: ClientId) {
        let floor = self
            .clients
            .iter()
            .filter(|c| c.known && c.in_flight > 0)
            .map(|c| c.counter)
            .min();
        let e = self.entry(client);
        if e.in_flight == 0
            && let Some(floor) = floor
        {
            e.counter = e.counter.max(floor);
        }
        e.in_flight += 1;
    }

    /// A request of `client` is gone (finished, failed, cancelled).
    pub fn finished(&mut self, client: ClientId) {
        let e = self.entry(client);
        e.in_flight = e.in_flight.saturating_sub(1);
    }

    /// `client` was served `tokens` (a step's decode token or prefill chunk).
    pub fn charge(&mut self, client: ClientId, tokens: usize) {
        let e = self.entry(client);
        e.counter += tokens as u64;
        e.served += tokens as u64;
    }

    /// The client disconnected.
    pub fn forget(&mut self, client: ClientId) {
        if let Some(e) = self.clients.get_mut(client.slot as usize)
            && e.generation == client.generation
        {
            *e = ClientShare::default();
        }
    }

    /// Order key of `client`: smaller is served first.
    pub fn key(&self, client: ClientId) -> u64 {
        match self.clients.get(client.slot as usize) {
            Some(e) if e.known && e.generation == client.generation => e.counter,
            _ => 0,
        }
    }

    /// Clients with requests in flight, as (client, tokens served since it connected)
    /// (status displays; a client that left without work in flight is never announced, so
    /// the in-flight count is what says it is still there).
    pub fn served(&self) -> impl Iterator<Item = (ClientId, u64)> + '_ {
        self.clients
            .iter()
            .enumerate()
            .filter(|(_, c)| c.known && c.in_flight > 0)
            .map(|(i, c)| {
                (
                    ClientId {
                        slot: i as u32,
                        generation: c.generation,
                    },
                    c.served,
                )
            })
    }
}

/// Order of queued requests and prefills: least-served client first (see the module docs),
/// then higher priority, then earlier arrival (`arrival` is any increasing stamp).
pub fn fair_key<T: Ord>(
    fair: &FairShare,
    client: ClientId,
    priority: u8,
    arrival: T,
) -> (u64, Reverse<u8>, T) {
    (fair.key(client), Reverse(priority), arrival)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(slot: u32) -> ClientId {
        ClientId {
            slot,
            generation: 0,
        }
    }

    #[test]
    fn least_served_first_and_idle_time_banks_nothing() {
        let mut f = FairShare::default();
        let (a, b, c) = (client(0), client(1), client(2));
        f.submitted(a);
        f.submitted(b);
        f.charge(a, 100);
        f.charge(b, 30);
        assert!(f.key(b) < f.key(a), "b was served less");
        // c arrives after a long idle: it starts level with the least-served active client,
        // not at zero (which would let it take the next 30 tokens' worth unopposed).
        f.submitted(c);
        assert_eq!(f.key(c), 30);
        f.finished(b);
        f.charge(c, 5);
        assert_eq!(
            f.served().map(|(_, t)| t).sum::<u64>(),
            105,
            "a and c are active"
        );
        // A reused slot is a new client.
        f.forget(a);
        let a2 = ClientId {
            slot: 0,
            generation: 1,
        };
        assert_eq!(f.key(a2), 0);
    }

    #[test]
    fn rank_is_priority_then_admission_then_sample() {
        let old_low = Rank::new(0, 1, 0);
        let new_low = Rank::new(0, 2, 0);
        let new_high = Rank::new(5, 3, 0);
        let mut v = vec![new_low, old_low, Rank::new(0, 1, 1), new_high];
        v.sort();
        assert_eq!(v, vec![new_high, old_low, Rank::new(0, 1, 1), new_low]);
        // The victim is the largest: lowest priority, most recently admitted.
        assert_eq!(v.iter().max(), Some(&new_low));
    }
}
