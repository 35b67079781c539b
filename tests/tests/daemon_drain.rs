//! SIGTERM: stop accepting, finish (or end) in-flight work, SHUTDOWN to every client, exit 0.

use std::time::Duration;

use nerva_client::{Client, Event, FinishReason, Prompt};
use nerva_tests::daemon_harness::{Daemon, test_engine, test_params};
use nix::sys::signal::Signal;

const DAEMON: &str = env!("CARGO_BIN_EXE_nervad-under-test");

/// Collect events until Shutdown (or the daemon hangs up).
fn events_until_shutdown(c: &mut Client) -> Vec<Event> {
    let mut events = Vec::new();
    loop {
        if c.wait(Some(Duration::from_secs(20))).is_err() {
            return events;
        }
        if c.poll(&mut events).is_err() || events.iter().any(|e| matches!(e, Event::Shutdown)) {
            return events;
        }
    }
}

#[test]
fn sigterm_finishes_in_flight_work_then_sends_shutdown_and_exits_zero() {
    let mut daemon = Daemon::start(
        DAEMON,
        if test_engine() {
            &["--test-step-us", "500"]
        } else {
            &[]
        },
    );
    let mut a = Client::connect(Some(daemon.socket())).expect("connect");
    let mut b = Client::connect(Some(daemon.socket())).expect("connect");
    a.submit_generate(Prompt::Text("drain me"), &test_params(50))
        .expect("submit");
    std::thread::sleep(Duration::from_millis(20));
    daemon.signal(Signal::SIGTERM);
    let ev_a = events_until_shutdown(&mut a);
    let ev_b = events_until_shutdown(&mut b);
    let done: Vec<_> = ev_a
        .iter()
        .filter_map(|e| match e {
            Event::Done { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        done,
        vec![FinishReason::Length],
        "in-flight work finished within the drain"
    );
    assert!(
        matches!(ev_a.last(), Some(Event::Shutdown)),
        "SHUTDOWN is the last event"
    );
    assert_eq!(ev_b, vec![Event::Shutdown]);
    let status = daemon
        .wait_exit(Duration::from_secs(10))
        .expect("daemon exits");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        Client::connect(Some(daemon.socket())).is_err(),
        "no longer accepting"
    );
    println!("SIGTERM drain: request finished (length), SHUTDOWN delivered to 2 clients, exit 0");
}

#[test]
fn drain_timeout_ends_long_requests_with_reason_shutdown() {
    if !test_engine() {
        return; // needs a stream that outlasts the drain timeout
    }
    let mut daemon = Daemon::start(
        DAEMON,
        &["--test-step-us", "2000", "--drain-timeout", "0.2"],
    );
    let mut a = Client::connect(Some(daemon.socket())).expect("connect");
    a.submit_generate(Prompt::Text("very long"), &test_params(4000))
        .expect("submit");
    std::thread::sleep(Duration::from_millis(50));
    daemon.signal(Signal::SIGINT);
    let ev = events_until_shutdown(&mut a);
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::Done {
            reason: FinishReason::Shutdown,
            ..
        }
    )));
    assert!(matches!(ev.last(), Some(Event::Shutdown)));
    let status = daemon.wait_exit(Duration::from_secs(10)).expect("exits");
    assert!(status.success());
}
