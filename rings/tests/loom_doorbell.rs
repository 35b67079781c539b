//! loom models of the need-wakeup doorbell handshake. The eventfd is modelled as a loom atomic
//! counter (the kernel's eventfd is a counter too); "blocking" is modelled by deciding to sleep
//! and then checking, once the producer is done, that a wake was delivered.
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p nerva-rings --release --test loom_doorbell`
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use nerva_rings::{NeedWakeup, SpscRing};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// One entry, one producer, one sleeper: whatever the interleaving, either the sleeper's
/// re-check sees the entry, or the producer sees the flag and rings. Then the entry is there.
fn handshake(fenced_sleep: bool) {
    model(move || {
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(2).expect("ring");
        let flag = Arc::new(NeedWakeup::new());
        let eventfd = Arc::new(AtomicU64::new(0));

        let producer = {
            let flag = flag.clone();
            let eventfd = eventfd.clone();
            thread::spawn(move || {
                p.push(99).expect("room");
                flag.wake_if_sleeping(|| {
                    eventfd.fetch_add(1, Ordering::Release);
                });
            })
        };

        // Sleeper: announce, re-check, decide.
        if fenced_sleep {
            flag.prepare_sleep();
        } else {
            flag.prepare_sleep_without_fence_for_loom();
        }
        let slept = !c.has_pending().expect("ring ok");
        producer.join().expect("producer");
        if slept {
            // It blocked in poll(2): only an eventfd write can wake it.
            assert!(
                eventfd.load(Ordering::Acquire) > 0,
                "lost wakeup: sleeper blocked and nobody rang"
            );
        }
        flag.finish_sleep();
        // No missed entry: after waking (or not sleeping) the entry is visible.
        assert_eq!(c.pop(), Ok(Some(99)));
    });
}

#[test]
fn no_lost_wakeup_and_no_missed_entry() {
    handshake(true);
}

/// Without the sleeper's SeqCst fence the flag store can be ordered after the re-check
/// (store buffering): the sleeper sees an empty ring, the producer sees no flag. loom finds it.
#[test]
#[should_panic(expected = "lost wakeup")]
fn dropping_the_sleep_fence_loses_a_wakeup() {
    handshake(false);
}

/// Two publishes while one sleep is announced cost exactly one ring, and the flag is clear
/// afterwards (the producer clears it when it rings).
#[test]
fn one_ring_per_sleep() {
    model(|| {
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(4).expect("ring");
        let flag = Arc::new(NeedWakeup::new());
        let rings = Arc::new(AtomicU64::new(0));
        flag.prepare_sleep();
        assert!(!c.has_pending().expect("ring ok"));
        let producer = {
            let flag = flag.clone();
            let rings = rings.clone();
            thread::spawn(move || {
                for v in 0..2 {
                    p.push(v).expect("room");
                    flag.wake_if_sleeping(|| {
                        rings.fetch_add(1, Ordering::Relaxed);
                    });
                }
            })
        };
        producer.join().expect("producer");
        assert_eq!(rings.load(Ordering::Relaxed), 1);
        assert!(!flag.is_set());
        assert_eq!(c.pop(), Ok(Some(0)));
        assert_eq!(c.pop(), Ok(Some(1)));
    });
}

/// The full sleeper loop, as `Waiter::wait` runs it, for two entries: the sleeper really
/// blocks (spins on the modelled eventfd counter, yielding to loom) and consumes the count
/// when it wakes. A lost wakeup would leave it spinning forever, which loom reports.
#[test]
fn sleeper_loop_receives_every_entry() {
    model(|| {
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(2).expect("ring");
        let flag = Arc::new(NeedWakeup::new());
        let eventfd = Arc::new(AtomicU64::new(0));
        let producer = {
            let flag = flag.clone();
            let eventfd = eventfd.clone();
            thread::spawn(move || {
                for v in 0..2 {
                    p.push(v).expect("room: capacity 2");
                    flag.wake_if_sleeping(|| {
                        eventfd.fetch_add(1, Ordering::Release);
                    });
                }
            })
        };
        let mut got = Vec::new();
        while got.len() < 2 {
            if let Some(v) = c.pop().expect("ring ok") {
                got.push(v);
                continue;
            }
            flag.prepare_sleep();
            if c.has_pending().expect("ring ok") {
                flag.finish_sleep();
                continue;
            }
            // Block until the eventfd count is non-zero; reading it resets it (one swap, like
            // read(2) on an eventfd).
            while eventfd.swap(0, Ordering::AcqRel) == 0 {
                thread::yield_now();
            }
            flag.finish_sleep();
        }
        producer.join().expect("producer");
        assert_eq!(got, [0, 1]);
    });
}
