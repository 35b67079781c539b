//! Many client processes at once: every request completes exactly once, with its own output.

use nerva_client::Client;
use nerva_tests::daemon_harness::{
    Daemon, prompt_for, run_prompts, stream_from_processes, test_engine, test_params,
};

const DAEMON: &str = env!("CARGO_BIN_EXE_nervad-under-test");
const CLIENT: &str = env!("CARGO_BIN_EXE_nerva-test-client");

#[test]
fn eight_processes_times_fifty_requests_each_get_exactly_their_own_outputs() {
    const PROCS: u32 = 8;
    const REQUESTS: u32 = 50;
    // The real engine in a debug build steps in tens of milliseconds: fewer tokens keep the
    // test fast while every request still streams several events.
    let tokens: u32 = if test_engine() { 12 } else { 4 };
    let daemon = Daemon::start(DAEMON, &[]);

    // Baseline through the same daemon, one client, so the comparison holds for any
    // deterministic engine (greedy, fixed length).
    let prompts: Vec<String> = (0..PROCS)
        .flat_map(|p| (0..REQUESTS).map(move |r| prompt_for(p, r)))
        .collect();
    let mut solo = Client::connect(Some(daemon.socket())).expect("connect");
    let baseline = run_prompts(&mut solo, &prompts, &test_params(tokens), 16).expect("baseline");
    drop(solo);
    let distinct: std::collections::HashSet<&String> = baseline.iter().map(|o| &o.text).collect();
    // With the test engine every prompt has its own output, so a crossed stream could not go
    // unnoticed. A random-weight model may collapse onto a few outputs; then the per-request
    // tags and sequence numbers (checked by the client library) carry the "no event crosses
    // clients" check.
    println!(
        "{} distinct outputs among {} requests",
        distinct.len(),
        baseline.len()
    );
    if test_engine() {
        assert!(
            distinct.len() > baseline.len() / 2,
            "prompts must produce distinguishable outputs for this test to mean anything"
        );
    }

    let streamed = stream_from_processes(CLIENT, daemon.socket(), PROCS, REQUESTS, tokens);
    let mut completed = 0;
    for (p, requests) in streamed.iter().enumerate() {
        for (r, got) in requests.iter().enumerate() {
            let want = &baseline[p * REQUESTS as usize + r];
            assert_eq!(got.text, want.text, "client {p} request {r}");
            assert_eq!(got.tokens, want.tokens, "client {p} request {r} tokens");
            assert_eq!(got.finish, want.finish);
            completed += 1;
        }
    }
    println!(
        "{PROCS} client processes × {REQUESTS} requests: {completed} completed exactly once, \
         each equal to its single-client baseline"
    );
    assert_eq!(completed, PROCS * REQUESTS);
}
