//! `nervactl ping`: NOP round trips through the daemon, busy and from sleep.

use std::path::Path;
use std::time::Duration;

use clap::Args;
use nerva_client::{Client, Error};

use super::display::percentile;
use super::table::{Column, Show, Table, col};

/// Ping flags.
#[derive(Debug, Args)]
pub struct PingArgs {
    /// Round trips per mode.
    #[arg(long, default_value_t = 10_000)]
    pub count: u32,
    /// Pause between sleep-mode pings in µs [default: 4 × the daemon's spin window, at least
    /// 1 ms], so the daemon is asleep in epoll when each ping arrives.
    #[arg(long)]
    pub sleep_us: Option<u64>,
    /// Round trips for the sleep mode [default: count / 10, at least 100].
    #[arg(long)]
    pub sleep_count: Option<u32>,
}

fn summary(name: &str, mut samples: Vec<u64>) -> serde_json::Value {
    samples.sort_unstable();
    let mean = samples.iter().sum::<u64>() as f64 / samples.len().max(1) as f64;
    serde_json::json!({
        "mode": name,
        "count": samples.len(),
        "min_ns": samples.first().copied().unwrap_or(0),
        "p50_ns": percentile(&samples, 0.5),
        "p90_ns": percentile(&samples, 0.9),
        "p99_ns": percentile(&samples, 0.99),
        "max_ns": samples.last().copied().unwrap_or(0),
        "mean_ns": mean,
    })
}

/// Columns of the round-trip table (human-scaled).
pub const PING_COLUMNS: [Column; 7] = [
    col("mode", Show::Text),
    col("count", Show::Number),
    col("min_ns", Show::Duration),
    col("p50_ns", Show::Duration),
    col("p90_ns", Show::Duration),
    col("p99_ns", Show::Duration),
    col("max_ns", Show::Duration),
];

/// Run it.
pub fn run(socket: Option<&Path>, a: &PingArgs, as_json: bool) -> Result<(), Error> {
    let mut client = Client::connect(socket)?;
    // The client spins for replies in both modes: what differs is whether the daemon is
    // awake (busy-polling) or asleep in epoll when the NOP arrives.
    client.set_spin(Duration::from_secs(1));
    let status: serde_json::Value =
        serde_json::from_str(&client.status()?).unwrap_or(serde_json::Value::Null);
    let spin_us = status["daemon"]["spin_us"].as_u64().unwrap_or(50);
    let pause = Duration::from_micros(a.sleep_us.unwrap_or((4 * spin_us).max(1000)));

    for _ in 0..100 {
        client.nop()?; // warm-up: page tables, caches, branch predictors
    }
    let mut busy = Vec::with_capacity(a.count as usize);
    for _ in 0..a.count {
        busy.push(client.nop()?.as_nanos() as u64);
    }
    let n_sleep = a.sleep_count.unwrap_or((a.count / 10).max(100));
    let mut asleep = Vec::with_capacity(n_sleep as usize);
    for _ in 0..n_sleep {
        std::thread::sleep(pause);
        asleep.push(client.nop()?.as_nanos() as u64);
    }
    let busy = summary("busy", busy);
    let asleep = summary("from_sleep", asleep);
    if as_json {
        println!(
            "{}",
            serde_json::json!({"daemon_spin_us": spin_us, "pause_us": pause.as_micros() as u64,
                               "results": [busy, asleep]})
        );
    } else {
        println!(
            "NOP round trip (daemon spin window {spin_us} µs; sleep-mode pause {} µs)",
            pause.as_micros()
        );
        let mut t = Table::new(&PING_COLUMNS);
        for r in [&busy, &asleep] {
            t.object_row(&PING_COLUMNS, r);
        }
        t.print();
    }
    Ok(())
}
