//! `nervactl`: poke a running `nervad` (status, clients, stats, ledger, generate, ping, bench,
//! shutdown) or run the demo.

mod nervactl {
    pub mod bench;
    pub mod demo;
    pub mod display;
    pub mod fork;
    pub mod generate;
    pub mod ledger;
    pub mod ping;
    pub mod sweep;
    pub mod table;
}

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nerva_client::{Client, Error};

use nervactl::{bench, demo, display, generate, ledger, ping, sweep};

/// Debugging CLI for the Nerva daemon. Human-readable tables by default, `--json` for scripts.
#[derive(Debug, Parser)]
#[command(name = "nervactl", version)]
struct Cli {
    /// Daemon socket [default: $NERVA_SOCKET, else $XDG_RUNTIME_DIR/nerva/nervad.sock, else
    /// /run/nerva/nervad.sock].
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    /// Print machine-readable JSON instead of tables (errors too: {"error": {...}} on stdout).
    #[arg(long, global = true)]
    json: bool,
    /// Give up after this many seconds (connect, replies, a whole generation) [default: 5 s
    /// per reply, no limit on a generation].
    #[arg(long, global = true, value_parser = parse_seconds)]
    timeout: Option<std::time::Duration>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Model, backend, device, arenas and page size, uptime.
    Status,
    /// Connected clients: pid, uid, ring occupancy, in-flight, tokens served.
    Clients {
        /// Also list this nervactl's own connection.
        #[arg(long)]
        all: bool,
    },
    /// Throughput, latency p50/p90/p99 per stage, the token ledger (per-token p50/p99 of wall
    /// latency and observation lag, mean cost per token, the recent samples' sums), the
    /// device and poll-thread ledgers. Per-token records: `nervactl ledger`.
    Stats,
    /// The token ledger of recent samples, one row per token: wall latency, observation lag,
    /// GPU time, graph replays, launches, syncs, copies (`--json` or `--out FILE` for the
    /// whole JSON document, every figure of every record).
    Ledger(ledger::LedgerArgs),
    /// Generate from a prompt and stream the text to stdout.
    Generate(generate::GenerateArgs),
    /// NOP round trips: while the daemon busy-polls, and waking it from sleep.
    Ping(ping::PingArgs),
    /// Spawn client processes that submit requests concurrently; print throughput and latency.
    /// `--streams 1,8,32`: a closed-loop sweep with rooflines; `--fork N`: N samples of one
    /// request against N requests.
    Bench(bench::BenchArgs),
    /// Ask the daemon to drain and exit.
    Shutdown {
        /// Wait until the daemon has exited (its socket hangs up), within --timeout if given.
        #[arg(long)]
        wait: bool,
    },
    /// Start a private nervad on the default demo model (or --model), stream one generation
    /// through this client, shut the daemon down.
    Demo(demo::DemoArgs),
    /// One benchmark client process (spawned by `bench`).
    #[command(hide = true)]
    BenchWorker(bench::WorkerArgs),
    /// One process's streams of a `bench --streams` level (spawned by `bench`).
    #[command(hide = true)]
    BenchStreamWorker(sweep::WorkerArgs),
}

fn parse_seconds(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err("the timeout must be a positive number of seconds".into());
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Connect, with the reply timeout set from --timeout.
fn connect(
    socket: Option<&std::path::Path>,
    timeout: Option<std::time::Duration>,
) -> Result<Client, Error> {
    let mut client = Client::connect(socket)?;
    if let Some(t) = timeout {
        client.set_reply_timeout(t);
    }
    Ok(client)
}

fn run(cli: &Cli) -> Result<(), Error> {
    let socket = cli.socket.as_deref();
    let timeout = cli.timeout;
    match &cli.command {
        Command::Status => {
            let json = connect(socket, timeout)?.status()?;
            display::print_status(&json, cli.json);
        }
        Command::Clients { all } => {
            let json = connect(socket, timeout)?.clients()?;
            // Our own connection is noise in the table unless asked for.
            let hide = (!*all).then(std::process::id);
            display::print_clients(&json, cli.json, hide);
        }
        Command::Stats => {
            let json = connect(socket, timeout)?.stats()?;
            display::print_stats(&json, cli.json);
        }
        Command::Ledger(args) => ledger::run(&mut connect(socket, timeout)?, args, cli.json)?,
        Command::Generate(args) => generate::run(socket, args, cli.json, timeout)?,
        Command::Ping(args) => ping::run(socket, args, cli.json)?,
        Command::Bench(args) => bench::run(socket, args, cli.json)?,
        Command::BenchWorker(args) => bench::worker(socket, args)?,
        Command::BenchStreamWorker(args) => sweep::worker(socket, args)?,
        Command::Demo(args) => demo::run(args)?,
        Command::Shutdown { wait } => {
            let mut client = connect(socket, timeout)?;
            let reply = client.shutdown_daemon()?;
            let started = std::time::Instant::now();
            if *wait {
                // The daemon closes every connection when it exits: wait for our hang-up.
                loop {
                    let left = timeout.map(|t| t.saturating_sub(started.elapsed()));
                    if left.is_some_and(|l| l.is_zero()) {
                        return Err(Error::Timeout);
                    }
                    match client.wait(left) {
                        Ok(_) => {
                            let _ = client.poll_with(|_| {});
                        }
                        Err(Error::DaemonGone) => break,
                        Err(e) => return Err(e),
                    }
                }
            }
            if cli.json {
                let reply: serde_json::Value =
                    serde_json::from_str(&reply).unwrap_or(serde_json::Value::Null);
                println!(
                    "{}",
                    serde_json::json!({"draining": reply["draining"], "exited": *wait,
                                       "waited_s": started.elapsed().as_secs_f64()})
                );
            } else if *wait {
                println!(
                    "daemon exited after {:.1} s",
                    started.elapsed().as_secs_f64()
                );
            } else {
                println!("daemon is draining");
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // A closed pipe (`nervactl stats | head -1`, a reader that went away mid-generation) ends
    // the process quietly as it ends cat or kubectl, instead of a panic in println!; the
    // daemon sees the hang-up and cancels what was in flight.
    // SAFETY: restoring the default disposition of one signal, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"error": {
                        "code": e.code().as_i32(),
                        "name": format!("{:?}", e.code()),
                        "message": e.to_string(),
                    }})
                );
            } else {
                eprintln!("nervactl: {e} [{}]", e.code().as_i32());
            }
            ExitCode::FAILURE
        }
    }
}
