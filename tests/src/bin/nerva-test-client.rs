//! A client process for the daemon tests. Modes (first argument):
//!
//! - `stream SOCKET INDEX REQUESTS MAX_TOKENS`: run `REQUESTS` prompts of client `INDEX`
//!   (window 8) and print one JSON line per request, in order: `{"text":…,"tokens":…,"finish":…}`.
//! - `hold SOCKET`: start a long generation, print `streaming` once text flows, keep reading
//!   until killed.
//! - `hostile SOCKET CORRUPTIONS SEED`: corrupt its own segment `CORRUPTIONS` times (random
//!   bytes, indices, descriptors, data), reconnecting whenever the daemon drops it; prints
//!   `{"corruptions":…,"reconnects":…}`.
//! - `connect-as SOCKET UID GID`: drop to uid/gid, connect, print the error code (0 = accepted).
//! - `stall SOCKET REQUESTS MAX_TOKENS CQ_ENTRIES`: connect with a `CQ_ENTRIES` completion ring,
//!   submit `REQUESTS` greedy generations, print `submitted`, then read nothing until a line
//!   arrives on stdin (its ring fills and the daemon pauses it); then collect everything and
//!   print one JSON line per request: `{"tokens":…,"text_bytes":…,"finish":…,"generated":…}`.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nerva_client::{Client, EventRef, GenerateParams, Prompt};
use nerva_rings::handshake::Hello;
use nerva_rings::{AdminQuery, ByteRange, Descriptor, GenerateRequest, PromptKind, SamplingParams};
use nerva_tests::daemon_harness::{prompt_for, run_prompts, test_params};
use nerva_tests::daemon_raw::{RawClient, raw_connect};
use rand::{Rng, RngCore, SeedableRng};

fn stream(socket: &Path, index: u32, requests: u32, max_tokens: u32) -> Result<(), String> {
    let mut client = Client::connect(Some(socket)).map_err(|e| e.to_string())?;
    let prompts: Vec<String> = (0..requests).map(|r| prompt_for(index, r)).collect();
    let outcomes = run_prompts(&mut client, &prompts, &test_params(max_tokens), 8)
        .map_err(|e| e.to_string())?;
    for o in outcomes {
        println!(
            "{}",
            serde_json::json!({"text": o.text, "tokens": o.tokens, "finish": o.finish})
        );
    }
    Ok(())
}

fn hold(socket: &Path) -> Result<(), String> {
    let mut client = Client::connect(Some(socket)).map_err(|e| e.to_string())?;
    let params = GenerateParams {
        max_tokens: 4000,
        ..test_params(4000)
    };
    client
        .submit_generate(Prompt::Text("hold this stream open"), &params)
        .map_err(|e| e.to_string())?;
    let mut announced = false;
    loop {
        client
            .wait(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let mut text = false;
        client
            .poll_with(|e| text |= matches!(e, EventRef::Text { .. }))
            .map_err(|e| e.to_string())?;
        if text && !announced {
            println!("streaming");
            announced = true;
        }
    }
}

fn hostile(socket: &Path, corruptions: u64, seed: u64) -> Result<(), String> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut done = 0u64;
    let mut reconnects = 0u64;
    let mut client: Option<RawClient> = None;
    let start = Instant::now();
    while done < corruptions {
        let c = match client.take() {
            Some(c) => c,
            None => {
                reconnects += 1;
                let mut tries = 0;
                loop {
                    match raw_connect(socket, Hello::new()) {
                        Ok(c) => break c,
                        Err(e) if tries > 200 => return Err(format!("reconnect failed: {e:?}")),
                        Err(_) => {
                            tries += 1;
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
            }
        };
        let mut c = c;
        let l = c.end.layout;
        // RingHeader = consumer line | producer line (CachePadded each).
        let line = (std::mem::size_of::<nerva_rings::RingHeader>() / 2) as u64;
        let sq_prod = l.sq_offset() + line;
        let cq_cons = l.cq_offset();
        let cq_prod = l.cq_offset() + line;
        for _ in 0..64 {
            done += 1;
            match rng.random_range(0..100u32) {
                // Random bytes anywhere in the segment (header, rings, regions).
                0..=24 => {
                    let mut b = [0u8; 8];
                    rng.fill_bytes(&mut b);
                    let n = rng.random_range(1..=8);
                    c.scribble(rng.random::<u64>(), &b[..n]);
                }
                // Random bytes into a submission slot, then publish it.
                25..=49 => {
                    let slot = rng.random_range(0..l.sq_entries()) as u64;
                    let mut d = [0u8; 64];
                    rng.fill_bytes(&mut d);
                    if rng.random_bool(0.5) {
                        d[0] = rng.random_range(0..4); // plausible opcode
                        d[1] = 1; // current version
                    }
                    c.scribble(l.sq_slots_offset() + slot * 64, &d);
                    let p = c.peek_u32(sq_prod);
                    c.scribble(sq_prod, &p.wrapping_add(1).to_ne_bytes());
                }
                // Well-formed GENERATEs pointing anywhere, with random parameters.
                50..=69 => {
                    let prompt = ByteRange::new(rng.random(), rng.random_range(0..64));
                    let mut g = GenerateRequest::new(rng.random(), PromptKind::Text, prompt);
                    g.max_tokens = rng.random_range(0..8);
                    g.sampling = SamplingParams {
                        temperature: f32::from_bits(rng.random()),
                        top_p: rng.random(),
                        ..SamplingParams::default()
                    };
                    if rng.random_bool(0.3) {
                        g.extension = Some(ByteRange::new(
                            rng.random_range(0..4096),
                            rng.random_range(1..64),
                        ));
                    }
                    let mut junk = [0u8; 64];
                    rng.fill_bytes(&mut junk);
                    let _ = c.end.input.write(rng.random_range(0..4000), &junk);
                    if let Ok(d) = Descriptor::generate(&g) {
                        let _ = c.end.submissions.push(d);
                    } else {
                        let _ = c.end.submissions.push(Descriptor::nop(1, 2));
                    }
                }
                // Admin queries with random reply ranges.
                70..=74 => {
                    let q = [AdminQuery::Status, AdminQuery::Clients, AdminQuery::Stats]
                        [rng.random_range(0..3)];
                    let r = ByteRange::new(rng.random(), rng.random());
                    let _ = c
                        .end
                        .submissions
                        .push(Descriptor::admin(rng.random(), q, r));
                }
                // Index games: consumer/producer indices of both rings.
                75..=76 => c.scribble(sq_prod, &rng.random::<u32>().to_ne_bytes()),
                77..=78 => c.scribble(cq_cons, &rng.random::<u32>().to_ne_bytes()),
                79 => c.scribble(cq_prod, &rng.random::<u32>().to_ne_bytes()),
                80 => c.scribble(l.sq_offset(), &rng.random::<u32>().to_ne_bytes()),
                // Need-wakeup flags.
                81..=84 => c.scribble(rng.random_range(0..512), &[rng.random()]),
                // Garbage over the input region.
                _ => {
                    let mut b = [0u8; 32];
                    rng.fill_bytes(&mut b);
                    let _ = c.end.input.write(rng.random_range(0..4000), &b);
                }
            }
        }
        // Consume everything the daemon wrote (so it keeps reading our ring) and wake it.
        let p = c.peek_u32(cq_prod);
        c.scribble(cq_cons, &p.to_ne_bytes());
        let _ = c.sq_bell.signal();
        if c.hung_up() {
            continue; // dropped for corrupt indices: reconnect
        }
        client = Some(c);
    }
    println!(
        "{}",
        serde_json::json!({"corruptions": done, "reconnects": reconnects,
                           "seconds": start.elapsed().as_secs_f64()})
    );
    Ok(())
}

fn connect_as(socket: &Path, uid: u32, gid: u32) -> Result<(), String> {
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    nix::unistd::setgid(nix::unistd::Gid::from_raw(gid)).map_err(|e| format!("setgid: {e}"))?;
    nix::unistd::setuid(nix::unistd::Uid::from_raw(uid)).map_err(|e| format!("setuid: {e}"))?;
    let code = match Client::connect(Some(socket)) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("{e}");
            e.code().as_i32()
        }
    };
    println!("{code}");
    Ok(())
}

fn stall(socket: &Path, requests: u32, max_tokens: u32, cq_entries: u32) -> Result<(), String> {
    use std::io::BufRead;
    let mut client = Client::connect_with(&nerva_client::ConnectOptions {
        socket: Some(socket.to_path_buf()),
        sizes: nerva_client::RingSizes {
            cq_entries,
            ..nerva_client::RingSizes::default()
        },
        ..nerva_client::ConnectOptions::default()
    })
    .map_err(|e| e.to_string())?;
    let params = GenerateParams {
        max_tokens,
        temperature: 0.0,
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let mut tags = Vec::new();
    for r in 0..requests {
        let prompt = prompt_for(99, r);
        let tag = client
            .submit_generate(Prompt::Text(&prompt), &params)
            .map_err(|e| e.to_string())?;
        tags.push(tag);
    }
    println!("submitted");
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    // (tokens, text bytes, finish, generated per Done)
    let mut out: Vec<(usize, usize, String, u32)> = vec![(0, 0, String::new(), 0); tags.len()];
    let deadline = Instant::now() + Duration::from_secs(120);
    while out.iter().any(|o| o.2.is_empty()) {
        if Instant::now() > deadline {
            return Err("requests did not finish after the stall".into());
        }
        client
            .wait(Some(Duration::from_secs(1)))
            .map_err(|e| e.to_string())?;
        let mut failure = None;
        client
            .poll_with(|e| {
                let Some(i) = e.tag().and_then(|t| tags.iter().position(|&x| x == t)) else {
                    return;
                };
                match e {
                    EventRef::Tokens { ids, .. } => out[i].0 += ids.len(),
                    EventRef::Text { text, .. } => out[i].1 += text.len(),
                    EventRef::Done {
                        reason, timings, ..
                    } => {
                        out[i].2 = reason.name().to_string();
                        out[i].3 = timings.generated_tokens;
                    }
                    EventRef::Error { detail, .. } => failure = Some(detail.to_string()),
                    _ => {}
                }
            })
            .map_err(|e| e.to_string())?;
        if let Some(f) = failure {
            return Err(format!("request failed: {f}"));
        }
    }
    for (tokens, text_bytes, finish, generated) in out {
        println!(
            "{}",
            serde_json::json!({"tokens": tokens, "text_bytes": text_bytes, "finish": finish,
                               "generated": generated})
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let num = |i: usize| arg(i).parse::<u64>().unwrap_or(0);
    let socket = arg(2);
    let socket = Path::new(&socket);
    let result = match arg(1).as_str() {
        "stream" => stream(socket, num(3) as u32, num(4) as u32, num(5) as u32),
        "hold" => hold(socket),
        "hostile" => hostile(socket, num(3), num(4)),
        "connect-as" => connect_as(socket, num(3) as u32, num(4) as u32),
        "stall" => stall(socket, num(3) as u32, num(4) as u32, num(5) as u32),
        other => Err(format!("unknown mode {other:?}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nerva-test-client: {e}");
            ExitCode::FAILURE
        }
    }
}
