//! Faults: a client killed mid-stream, a daemon killed under its clients, connect storms, a
//! peer outside the access policy.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nerva_client::{Client, Error, ErrorCode, Prompt};
use nerva_tests::daemon_harness::{Daemon, prompt_for, run_prompts, test_engine, test_params};
use nix::sys::signal::Signal;

const DAEMON: &str = env!("CARGO_BIN_EXE_nervad-under-test");
const CLIENT: &str = env!("CARGO_BIN_EXE_nerva-test-client");

/// Keep streams alive long enough to be killed mid-flight (test engine only).
fn slow_engine() -> Vec<&'static str> {
    if test_engine() {
        vec!["--test-step-us", "1000"]
    } else {
        vec![]
    }
}

#[test]
fn sigkilled_client_is_reclaimed_and_others_keep_being_served() {
    let daemon = Daemon::start(DAEMON, &slow_engine());
    let mut steady = Client::connect(Some(daemon.socket())).expect("connect");
    let prompts: Vec<String> = (0..6).map(|r| prompt_for(100, r)).collect();
    let before = run_prompts(&mut steady, &prompts, &test_params(8), 6).expect("before");
    // Settle the segment pool, then take the baseline with the steady client connected.
    std::thread::sleep(Duration::from_millis(300));
    let (fds0, segs0) = (daemon.fd_count(), daemon.segment_count());

    let mut victim = Command::new(CLIENT)
        .arg("hold")
        .arg(daemon.socket())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    BufReader::new(victim.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line.trim(), "streaming");
    assert!(
        daemon.fd_count() > fds0,
        "the victim holds daemon resources while connected"
    );
    // Let the acceptor refill its segment pool first, so what follows times reclamation only.
    std::thread::sleep(Duration::from_millis(400));

    victim.kill().expect("SIGKILL");
    victim.wait().expect("reap");
    let reclaimed = daemon
        .settle(Duration::from_secs(5), |d| {
            d.fd_count() == fds0 && d.segment_count() == segs0
        })
        .expect("fd and segment counts return to baseline");
    let after = run_prompts(&mut steady, &prompts, &test_params(8), 6).expect("after");
    assert_eq!(
        before, after,
        "the surviving client's outputs are unchanged"
    );
    println!(
        "client SIGKILLed mid-stream: daemon fds {fds0} -> back to {} and segments {segs0} -> back \
         to {} within {reclaimed:?}; the other client's outputs unchanged",
        daemon.fd_count(),
        daemon.segment_count()
    );
}

#[test]
fn daemon_sigkill_makes_the_next_client_call_fail_within_a_second() {
    let daemon = Daemon::start(DAEMON, &slow_engine());
    // A client blocked in wait with a request in flight.
    let mut waiting = Client::connect(Some(daemon.socket())).expect("connect");
    waiting
        .submit_generate(Prompt::Text("long"), &test_params(4000))
        .expect("submit");
    // A client that only polls (non-blocking) and one that is idle.
    let mut polling = Client::connect(Some(daemon.socket())).expect("connect");
    let mut idle = Client::connect(Some(daemon.socket())).expect("connect");
    let waiter = std::thread::spawn(move || {
        let mut events = Vec::new();
        loop {
            match waiting.wait(Some(Duration::from_secs(10))) {
                Ok(_) => {
                    if let Err(e) = waiting.poll(&mut events) {
                        return (Instant::now(), e);
                    }
                }
                Err(e) => return (Instant::now(), e),
            }
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let killed_at = Instant::now();
    daemon.signal(Signal::SIGKILL);

    let (when, err) = waiter.join().expect("waiter");
    let wait_latency = when.duration_since(killed_at);
    assert_eq!(err.code(), ErrorCode::DaemonGone, "{err}");
    let mut events = Vec::new();
    let poll_result = loop {
        match polling.poll(&mut events) {
            Ok(_) if killed_at.elapsed() < Duration::from_secs(2) => {
                std::thread::sleep(Duration::from_micros(200))
            }
            other => break other,
        }
    };
    let poll_latency = killed_at.elapsed();
    assert!(
        matches!(poll_result, Err(Error::DaemonGone)),
        "{poll_result:?}"
    );
    let nop = idle.nop();
    assert!(nop.is_err(), "NOP to a dead daemon fails");
    println!(
        "daemon SIGKILL: blocked wait failed after {wait_latency:?}, non-blocking poll after \
         {poll_latency:?}, nop: {:?}",
        nop.err().map(|e| e.code())
    );
    assert!(wait_latency < Duration::from_secs(1));
    assert!(poll_latency < Duration::from_secs(1));
}

#[test]
fn thousand_connect_disconnect_cycles_do_not_grow_fds_or_rss() {
    let daemon = Daemon::start(DAEMON, &[]);
    let cycles = 1000;
    // Warm up allocator pools and the segment pool, then measure.
    for _ in 0..20 {
        Client::connect(Some(daemon.socket()))
            .expect("connect")
            .close();
    }
    std::thread::sleep(Duration::from_millis(400));
    let (fds0, rss0) = (daemon.fd_count_without_pool(), daemon.rss_kib());
    let start = Instant::now();
    for i in 0..cycles {
        let mut c = Client::connect(Some(daemon.socket())).expect("connect");
        if i % 100 == 0 {
            c.nop().expect("nop");
        }
        c.close();
    }
    let took = start.elapsed();
    // Let the poll thread reap the last hang-ups and the acceptor refill its pool.
    daemon.settle(Duration::from_secs(5), |d| {
        d.fd_count_without_pool() == fds0
    });
    std::thread::sleep(Duration::from_millis(500));
    let (fds1, rss1) = (daemon.fd_count_without_pool(), daemon.rss_kib());
    let pool_fds = daemon.fd_count() - fds1;
    println!(
        "{cycles} connect/disconnect cycles in {took:?}: daemon fds (besides the segment pool) \
         {fds0} -> {fds1}, pool memfds {pool_fds} (≤ 4), RSS {rss0} KiB -> {rss1} KiB ({:+} KiB)",
        rss1 as i64 - rss0 as i64
    );
    assert_eq!(
        fds1,
        fds0,
        "no descriptor leaks; daemon fds now: {:?}; log tail:\n{}",
        daemon.fd_targets(),
        daemon
            .log()
            .lines()
            .rev()
            .take(15)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        pool_fds <= 4,
        "the segment pool stays within --segment-pool"
    );
    // Each cycle maps and unmaps a ~1.4 MiB segment; a leak of one would be > 1 GiB here.
    assert!(rss1 < rss0 + 16 * 1024, "RSS grew beyond noise");
}

#[test]
fn peer_outside_the_access_policy_is_refused() {
    // Policy admitting only uid 4242: this process (any other uid) is refused.
    let daemon = Daemon::start(DAEMON, &["--allow-uid", "4242"]);
    // Without the segment pool (the acceptor fills it in the background), and only once the
    // count has held still for a moment: start-up may still hold a transient descriptor.
    let mut fds0 = daemon.fd_count_without_pool();
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(100));
        let now = daemon.fd_count_without_pool();
        if now == fds0 {
            break;
        }
        fds0 = now;
    }
    let err = Client::connect(Some(daemon.socket())).expect_err("refused");
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    println!("refused by policy: {err}");
    daemon.settle(Duration::from_secs(2), |d| {
        d.fd_count_without_pool() <= fds0
    });
    let fds1 = daemon.fd_count_without_pool();
    assert!(
        fds1 <= fds0,
        "a refused peer leaves nothing behind: daemon fds {fds0} -> {fds1}"
    );
    drop(daemon);

    // Default policy (daemon's uid, socket group), world-writable socket so the kernel lets
    // the peer connect and the policy is what refuses it: a child that drops to nobody.
    if !nix::unistd::geteuid().is_root() {
        println!("not root: skipping the setuid variant");
        return;
    }
    let daemon = Daemon::start(DAEMON, &["--socket-mode", "0666"]);
    let out = Command::new(CLIENT)
        .arg("connect-as")
        .arg(daemon.socket())
        .args(["65534", "65534"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let code: i32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("code");
    assert_eq!(code, ErrorCode::PermissionDenied.as_i32());
    // And the daemon's own uid is admitted.
    Client::connect(Some(daemon.socket())).expect("own uid admitted");
}

#[test]
fn a_live_daemon_keeps_its_socket_and_a_stale_socket_is_replaced() {
    let first = Daemon::start(DAEMON, &[]);
    // A second daemon on the same path refuses to start while the first answers.
    let out = Command::new(DAEMON)
        .arg("serve")
        .arg("--socket")
        .arg(first.socket())
        .args(nerva_tests::daemon_harness::engine_args())
        .output()
        .expect("run second daemon");
    assert!(!out.status.success(), "second daemon must not start");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("live daemon"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Client::connect(Some(first.socket()))
        .expect("the first daemon still serves")
        .nop()
        .expect("nop");

    // SIGKILL leaves the socket file behind; the next daemon detects it is stale and replaces it.
    let path = first.socket().to_path_buf();
    first.signal(Signal::SIGKILL);
    std::thread::sleep(Duration::from_millis(100));
    assert!(path.exists(), "a killed daemon leaves its socket file");
    let mut third = Command::new(DAEMON)
        .arg("serve")
        .arg("--socket")
        .arg(&path)
        .args(nerva_tests::daemon_harness::engine_args())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn third daemon");
    let deadline = Instant::now() + Duration::from_secs(30);
    let served = loop {
        if let Ok(mut c) = Client::connect(Some(&path)) {
            break c.nop().is_ok();
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = third.kill();
    let _ = third.wait();
    assert!(served, "a daemon starts over a stale socket");
    drop(first);
}

#[test]
fn connects_beyond_max_clients_are_refused_and_slots_are_reused() {
    let daemon = Daemon::start(DAEMON, &["--max-clients", "2"]);
    // Hang-ups (of the harness's readiness probe, of `a` below) are reaped asynchronously:
    // a connect may see the slot still taken for a moment.
    let connect_retry = || {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match Client::connect(Some(daemon.socket())) {
                Ok(c) => return c,
                Err(e) if e.code() == ErrorCode::TooManyClients && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("slot not reused: {e}"),
            }
        }
    };
    let a = connect_retry();
    let mut b = connect_retry();
    let err = Client::connect(Some(daemon.socket())).expect_err("third refused");
    assert_eq!(err.code(), ErrorCode::TooManyClients, "{err}");
    drop(a);
    let mut c = connect_retry();
    c.nop().expect("new client served");
    b.nop().expect("old client still served");
}
