//! loom models of the SPSC ring: every interleaving (up to the preemption bound) of a producer
//! and a consumer thread, with loom checking each slot access for data races through the
//! ring's `sync` cells. Run:
//! `RUSTFLAGS="--cfg loom" cargo test -p nerva-rings --release --test loom_ring`
#![cfg(loom)]

use loom::thread;
use nerva_rings::{PushError, SpscRing};

/// Bounded preemptions keep the suite fast on 2 cores while still covering the interleavings
/// that matter for a two-thread protocol (each bug below needs at most 2 preemptions).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

fn push_retrying(p: &mut nerva_rings::Producer<u64>, mut value: u64) {
    loop {
        match p.push(value) {
            Ok(()) => return,
            Err(PushError::Full(v)) => {
                value = v;
                thread::yield_now();
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
}

fn pop_retrying(c: &mut nerva_rings::Consumer<u64>) -> u64 {
    loop {
        match c.pop() {
            Ok(Some(v)) => return v,
            Ok(None) => thread::yield_now(),
            Err(e) => panic!("unexpected {e}"),
        }
    }
}

#[test]
fn wrap_around_preserves_order() {
    model(|| {
        // Capacity 2 and 5 entries: indices wrap the slot array twice.
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(2).expect("ring");
        let producer = thread::spawn(move || {
            for v in 0..5 {
                push_retrying(&mut p, v);
            }
        });
        for expected in 0..5 {
            assert_eq!(pop_retrying(&mut c), expected);
        }
        producer.join().expect("producer");
        assert_eq!(c.pop(), Ok(None));
    });
}

#[test]
fn full_and_empty_are_reported_exactly() {
    model(|| {
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(2).expect("ring");
        let consumer = thread::spawn(move || {
            // Either empty (producer not there yet) or the first entry, never anything else.
            let first = c.pop().expect("ring ok");
            assert!(matches!(first, None | Some(10)));
            (c, first.is_some())
        });
        p.push(10).expect("empty ring has room");
        p.push(11).expect("one free slot");
        // Full unless the consumer already released entry 10.
        let third = p.push(12);
        let (mut c, consumer_took_one) = consumer.join().expect("consumer");
        match third {
            Ok(()) => assert!(consumer_took_one, "push succeeded on a full ring"),
            Err(PushError::Full(12)) => {}
            Err(e) => panic!("unexpected {e}"),
        }
        // Drain: what is left is exactly what was pushed and not yet taken, in order.
        let mut rest = Vec::new();
        while let Some(v) = c.pop().expect("ring ok") {
            rest.push(v);
        }
        let expected: &[u64] = match (consumer_took_one, third.is_ok()) {
            (true, true) => &[11, 12],
            (true, false) => &[11],
            (false, _) => &[10, 11],
        };
        assert_eq!(rest, expected);
    });
}

#[test]
fn batch_commit_and_consume() {
    model(|| {
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(4).expect("ring");
        let producer = thread::spawn(move || {
            let values = [1u64, 2, 3, 4, 5, 6];
            let mut sent = 0;
            while sent < values.len() {
                // One Release store per batch.
                sent += p
                    .push_slice(&values[sent..(sent + 3).min(6)])
                    .expect("ring ok");
                if sent < values.len() {
                    thread::yield_now();
                }
            }
        });
        let mut got = Vec::new();
        let mut buf = [0u64; 4];
        while got.len() < 6 {
            let n = c.pop_slice(&mut buf).expect("ring ok");
            got.extend_from_slice(&buf[..n]);
            if n == 0 {
                thread::yield_now();
            }
        }
        producer.join().expect("producer");
        assert_eq!(got, [1, 2, 3, 4, 5, 6]);
    });
}

#[test]
fn staged_entries_stay_invisible_until_commit() {
    model(|| {
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(4).expect("ring");
        let producer = thread::spawn(move || {
            p.stage(7).expect("room");
            p.stage(8).expect("room");
            p.commit();
        });
        // The consumer sees nothing or both: one publish covers the whole batch.
        let mut seen = Vec::new();
        c.consume(4, |v| seen.push(v)).expect("ring ok");
        assert!(seen.is_empty() || seen == [7, 8], "partial batch {seen:?}");
        producer.join().expect("producer");
    });
}

/// The publish weakened to Relaxed: the consumer can see the new index without the slot
/// write happening-before its read. loom reports the race on the slot cell.
#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_publish_is_caught() {
    model(|| {
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(2).expect("ring");
        let producer = thread::spawn(move || {
            p.stage(42).expect("room");
            p.commit_relaxed_for_loom();
        });
        if let Some(v) = c.pop().expect("ring ok") {
            assert_eq!(v, 42);
        }
        producer.join().expect("producer");
    });
}
