//! `nervactl`: poke a running `nervad` (status, clients, stats, generate, ping, bench, shutdown).

mod nervactl {
    pub mod bench;
    pub mod display;
    pub mod generate;
    pub mod ping;
}

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nerva_client::{Client, Error};

use nervactl::{bench, display, generate, ping};

/// Debugging CLI for the Nerva daemon. Human-readable tables by default, `--json` for scripts.
#[derive(Debug, Parser)]
#[command(name = "nervactl", version)]
struct Cli {
    /// Daemon socket [default: $NERVA_SOCKET, else $XDG_RUNTIME_DIR/nerva/nervad.sock, else
    /// /run/nerva/nervad.sock].
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Model, backend, device, arenas and page size, uptime.
    Status,
    /// Connected clients: pid, uid, ring occupancy, in-flight, tokens served.
    Clients,
    /// Throughput and latency p50/p90/p99 per stage, hot-path ledger.
    Stats,
    /// Generate from a prompt and stream the text to stdout.
    Generate(generate::GenerateArgs),
    /// NOP round trips: while the daemon busy-polls, and waking it from sleep.
    Ping(ping::PingArgs),
    /// Spawn client processes that submit requests concurrently; print throughput and latency.
    Bench(bench::BenchArgs),
    /// Ask the daemon to drain and exit.
    Shutdown,
    /// One benchmark client process (spawned by `bench`).
    #[command(hide = true)]
    BenchWorker(bench::WorkerArgs),
}

fn run(cli: Cli) -> Result<(), Error> {
    let socket = cli.socket.as_deref();
    match cli.command {
        Command::Status => {
            let json = Client::connect(socket)?.status()?;
            display::print_status(&json, cli.json);
        }
        Command::Clients => {
            let json = Client::connect(socket)?.clients()?;
            display::print_clients(&json, cli.json);
        }
        Command::Stats => {
            let json = Client::connect(socket)?.stats()?;
            display::print_stats(&json, cli.json);
        }
        Command::Generate(args) => generate::run(socket, &args, cli.json)?,
        Command::Ping(args) => ping::run(socket, &args, cli.json)?,
        Command::Bench(args) => bench::run(socket, &args, cli.json)?,
        Command::BenchWorker(args) => bench::worker(socket, &args)?,
        Command::Shutdown => {
            let reply = Client::connect(socket)?.shutdown_daemon()?;
            if cli.json {
                println!("{reply}");
            } else {
                println!("daemon is draining");
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nervactl: {e} [{}]", e.code().as_i32());
            ExitCode::FAILURE
        }
    }
}
