//! `nervactl ledger`: the daemon's token ledger of recent samples — per token: wall latency,
//! observation lag, device and host time, graph replays, launches, syncs by class, copies,
//! allocations — as a table, as JSON, or written to a file.

use std::path::PathBuf;

use clap::Args;
use nerva_client::{Client, Error};
use serde_json::Value;

use super::table::{Column, Show, Table, col};

/// Flags of `ledger`.
#[derive(Debug, Args)]
pub struct LedgerArgs {
    /// Only the N most recently finished samples [default: every sample the daemon kept].
    #[arg(long, value_name = "N")]
    pub samples: Option<usize>,
    /// Write the JSON document to FILE instead of printing (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Columns of the per-token table (human-scaled; the JSON has every figure).
pub const RECORD_COLUMNS: [Column; 16] = [
    col("client_slot", Show::Number),
    col("tag", Show::Number),
    col("sample", Show::Number),
    col("index", Show::Number),
    col("token", Show::Number),
    col("at_ns", Show::Duration),
    col("wall_ns", Show::Duration),
    col("lag_ns", Show::Duration),
    col("gpu_ns", Show::Duration),
    col("batch", Show::Number),
    col("steps", Show::Number),
    col("launches", Show::Number),
    col("graph_nodes", Show::Number),
    col("syncs_hard", Show::Number),
    col("h2d_bytes", Show::Bytes),
    col("d2h_bytes", Show::Bytes),
];

/// Keep only the `n` most recent samples of a ledger document.
fn keep_recent(doc: &mut Value, n: usize) {
    if let Some(samples) = doc["samples"].as_array_mut() {
        let drop = samples.len().saturating_sub(n);
        samples.drain(..drop);
    }
}

/// Run it.
pub fn run(client: &mut Client, a: &LedgerArgs, as_json: bool) -> Result<(), Error> {
    let reply = client.ledger()?;
    let mut doc: Value = serde_json::from_str(&reply)
        .map_err(|e| Error::Protocol(format!("ledger reply is not JSON: {e}")))?;
    if let Some(n) = a.samples {
        keep_recent(&mut doc, n);
    }
    match &a.out {
        Some(path) if path.as_os_str() != "-" => {
            std::fs::write(path, format!("{doc}\n"))?;
            let samples = doc["samples"].as_array().map_or(0, Vec::len);
            if as_json {
                println!(
                    "{}",
                    serde_json::json!({"written": path.display().to_string(), "samples": samples})
                );
            } else {
                eprintln!("nervactl: wrote {samples} samples to {}", path.display());
            }
            return Ok(());
        }
        Some(_) => {
            println!("{doc}");
            return Ok(());
        }
        None if as_json => {
            println!("{doc}");
            return Ok(());
        }
        None => {}
    }
    let mut t = Table::new(&RECORD_COLUMNS);
    for s in doc["samples"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        for r in s["records"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            // Each record row names its sample.
            let mut row = r.clone();
            for k in ["client_slot", "tag", "sample"] {
                row[k] = s[k].clone();
            }
            t.object_row(&RECORD_COLUMNS, &row);
        }
    }
    t.print();
    if t.is_empty() {
        println!("(no finished samples yet)");
    }
    let omitted = doc["omitted_samples"].as_u64().unwrap_or(0);
    if omitted > 0 {
        eprintln!("nervactl: {omitted} older samples did not fit the reply and were left out");
    }
    Ok(())
}
