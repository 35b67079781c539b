//! Percentiles over latency samples, and a clock-overhead probe so readers know the floor.

use std::time::Instant;

/// Summary of a set of nanosecond samples.
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Smallest sample.
    pub min: u64,
    /// Largest sample.
    pub max: u64,
    /// Arithmetic mean.
    pub mean: f64,
}

/// Sorts `samples` in place and summarises them (nearest-rank percentiles).
/// An empty slice gives an all-zero summary.
pub fn summarize(samples: &mut [u64]) -> Summary {
    if samples.is_empty() {
        return Summary::default();
    }
    samples.sort_unstable();
    let n = samples.len();
    let rank = |p: f64| -> u64 {
        // Nearest rank: the smallest sample with at least p of the samples at or below it.
        let idx = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
        samples[idx]
    };
    let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
    Summary {
        count: n,
        p50: rank(0.50),
        p90: rank(0.90),
        p99: rank(0.99),
        p999: rank(0.999),
        min: samples[0],
        max: samples[n - 1],
        mean: sum as f64 / n as f64,
    }
}

/// Median of a few repetitions (used to pick a representative run out of several).
pub fn median_f64(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// Median cost of one `Instant::now()` call in ns: the resolution floor of every per-sample
/// latency in the lab (samples include one clock read).
pub fn clock_overhead_ns() -> u64 {
    let mut samples = Vec::with_capacity(10_001);
    let mut prev = Instant::now();
    for _ in 0..10_000 {
        let now = Instant::now();
        samples.push(now.duration_since(prev).as_nanos() as u64);
        prev = now;
    }
    summarize(&mut samples).p50
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_one_to_hundred() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        let s = summarize(&mut v);
        assert_eq!((s.p50, s.p90, s.p99, s.min, s.max), (50, 90, 99, 1, 100));
        assert!((s.mean - 50.5).abs() < 1e-9);
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(summarize(&mut []).count, 0);
    }
}
