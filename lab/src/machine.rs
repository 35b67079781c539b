//! Where and when a measurement was taken: the header every experiment prints above its table.

use std::time::{SystemTime, UNIX_EPOCH};

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// CPU model as `lscpu` shows it ("Model name"), from `/proc/cpuinfo`.
pub fn cpu_model() -> String {
    read_trimmed("/proc/cpuinfo")
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Today's UTC date and time, `YYYY-MM-DD HH:MM`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02}")
}

/// Prints the context lines (markdown) that belong above a result table: what, when, where,
/// how loaded, and the exact command.
pub fn print_header(experiment: &str) {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = read_trimmed("/proc/loadavg").unwrap_or_default();
    let cmd: Vec<String> = std::env::args().collect();
    let build = if cfg!(debug_assertions) {
        "DEBUG build (numbers meaningless)"
    } else {
        "release"
    };
    println!();
    println!("### {experiment}");
    println!();
    println!("- date: {} UTC", utc_now());
    println!(
        "- machine: {} · {cores} cores · kernel {kernel} · {build}",
        cpu_model()
    );
    println!("- load average at start: {load}");
    println!("- command: `{}`", cmd.join(" "));
    println!();
}
