//! A daemon whose KV pool holds a few sequences at a time, under four client processes: the
//! pool runs dry, sequences are preempted (recomputed, swapped to the host and back, or
//! swapped until the host area is full and then recomputed), and every request's tokens
//! (seeded sampling) equal those a daemon with room for all gives one client.

use nerva_client::Client;
use nerva_tests::daemon_harness::{
    Daemon, prompt_for, run_prompts, stream_from_processes, test_engine, test_params,
};

const DAEMON: &str = env!("CARGO_BIN_EXE_nervad-under-test");
const CLIENT: &str = env!("CARGO_BIN_EXE_nerva-test-client");

/// Serve the workload on a roomy daemon (one client) and on a tight one with `preemption`
/// arguments (four client processes); check every output and return the tight daemon's live
/// engine figures once all is done.
fn tight_pool_outputs_are_exact(preemption: &[&str]) -> Option<serde_json::Value> {
    if test_engine() {
        println!("skipped: the test engine has no KV pool (NERVA_TEST_ENGINE=test)");
        return None;
    }
    const PROCS: u32 = 4;
    const REQUESTS: u32 = 4;
    const TOKENS: u32 = 40;
    // The default tiny model keeps 1 KiB of KV per token on the CPU (2 layers, K and V, 64
    // f32 each): 16-token pages of 16 KiB. A 128-token context needs 8 pages; 10 pages hold
    // about three of these requests (a ~40-token prompt plus 40 tokens) at a time.
    let common = ["--max-context", "128", "--max-step-tokens", "32"];
    let roomy = Daemon::start(DAEMON, &common);
    let prompts: Vec<String> = (0..PROCS)
        .flat_map(|p| (0..REQUESTS).map(move |r| prompt_for(p, r)))
        .collect();
    let mut solo = Client::connect(Some(roomy.socket())).expect("connect");
    let baseline = run_prompts(&mut solo, &prompts, &test_params(TOKENS), 16).expect("baseline");
    drop(solo);
    drop(roomy);

    let mut args = common.to_vec();
    args.extend(["--kv-bytes", "160KiB"]);
    args.extend(preemption);
    let tight = Daemon::start(DAEMON, &args);
    let streamed = stream_from_processes(CLIENT, tight.socket(), PROCS, REQUESTS, TOKENS);
    for (p, requests) in streamed.iter().enumerate() {
        for (r, got) in requests.iter().enumerate() {
            let want = &baseline[p * REQUESTS as usize + r];
            assert_eq!(
                got.tokens, want.tokens,
                "{preemption:?}: client {p} request {r}"
            );
            assert_eq!(got.finish, want.finish);
        }
    }
    let mut admin = Client::connect(Some(tight.socket())).expect("connect");
    let stats: serde_json::Value =
        serde_json::from_str(&admin.stats().expect("stats")).expect("stats json");
    let live = stats["engine"]["live"].clone();
    let preemptions = live["preemptions"].as_u64().expect("preemptions gauge");
    println!("{preemptions} preemptions, live engine figures: {live}");
    assert!(preemptions > 0, "the pool never ran dry: {live}");
    assert_eq!(live["kv_pages_used"], 0, "every page returned");
    assert_eq!(live["swap_pages_used"], 0, "every host swap page returned");
    assert_eq!(live["swapped"], 0);
    assert_eq!(live["swap_ins"], live["swap_outs"]);
    let status: serde_json::Value =
        serde_json::from_str(&admin.status().expect("status")).expect("status json");
    assert_eq!(status["swap"]["pages_used"], 0, "status: {status}");
    Some(live)
}

#[test]
fn a_tiny_kv_pool_preempts_by_recompute_and_every_output_stays_exact() {
    let Some(live) = tight_pool_outputs_are_exact(&["--preemption", "recompute"]) else {
        return;
    };
    assert_eq!(live["swap_outs"], 0, "recompute never swaps: {live}");
    assert_eq!(live["swap_pages_free"], 0, "no swap area: {live}");
}

#[test]
fn a_tiny_kv_pool_preempts_by_swap_and_every_output_stays_exact() {
    // 64 host pages of 16 KiB: room for every victim.
    let Some(live) =
        tight_pool_outputs_are_exact(&["--preemption", "swap", "--swap-space", "1MiB"])
    else {
        return;
    };
    assert_eq!(
        live["swap_outs"], live["preemptions"],
        "every victim swapped: {live}"
    );
    assert_eq!(live["swap_pages_free"], 64);
}

#[test]
fn a_full_swap_area_recomputes_and_every_output_stays_exact() {
    // 2 host pages: too few for most victims, which recompute instead.
    let Some(live) = tight_pool_outputs_are_exact(&["--swap-space", "32KiB"]) else {
        return;
    };
    let (swaps, preemptions) = (live["swap_outs"].as_u64(), live["preemptions"].as_u64());
    assert!(swaps > Some(0), "some victims swapped: {live}");
    assert!(swaps < preemptions, "some victims recomputed: {live}");
}
