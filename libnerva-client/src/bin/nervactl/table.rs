//! Aligned tables for `nervactl`'s human output (kubectl / nvidia-smi style).
//!
//! One rule ties the tables to `--json`: a column is named after its JSON key. A column that
//! prints raw numbers keeps the key's unit in its header (`p50_us` → `P50 (µs)`); a column
//! that prints human-scaled values drops the unit suffix (`gpu_ns` → `GPU`, values such as
//! `1.25ms`). Cells never contain two spaces in a row, so columns split on runs of two or more
//! spaces.

use serde_json::Value;

/// How a column shows the JSON value under its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    /// Text or a plain count, as is; left-aligned.
    Text,
    /// A number as is, right-aligned; the key's unit suffix (if any) goes into the header.
    Number,
    /// Bytes, human-scaled (`B`, `KiB`, `MiB`, `GiB`, `TiB`).
    Bytes,
    /// A duration in the key's unit (`_ns`, `_us`, `_ms`, `_s`), human-scaled.
    Duration,
    /// Bytes per second, human-scaled in decimal units as bandwidths are quoted (`3.35TB/s`).
    ByteRate,
}

/// A column: the JSON key it shows and how.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    /// JSON key (last path component).
    pub key: &'static str,
    /// How values are shown.
    pub show: Show,
}

/// `Column { key, show }`.
pub const fn col(key: &'static str, show: Show) -> Column {
    Column { key, show }
}

/// Unit suffixes of JSON keys and how a header writes them.
const UNITS: [(&str, &str); 6] = [
    ("_bytes", "bytes"),
    ("_ns", "ns"),
    ("_us", "µs"),
    ("_ms", "ms"),
    ("_s", "s"),
    ("_per_s", "/s"),
];

/// The key without its unit suffix, and the unit as a header writes it.
fn split_unit(key: &str) -> (&str, Option<&'static str>) {
    // Longest suffix first so `_per_s` wins over `_s`.
    let mut best: Option<(&str, &'static str)> = None;
    for (suffix, unit) in UNITS {
        if let Some(stem) = key.strip_suffix(suffix)
            && best.is_none_or(|(b, _)| stem.len() < b.len())
        {
            best = Some((stem, unit));
        }
    }
    match best {
        Some((stem, unit)) => (stem, Some(unit)),
        None => (key, None),
    }
}

/// The header of a column (module docs).
pub fn header(c: &Column) -> String {
    let (stem, unit) = split_unit(c.key);
    let name = stem.replace('_', " ").to_uppercase();
    match (c.show, unit) {
        (Show::Number | Show::Text, Some(unit)) => format!("{name} ({unit})"),
        _ => name,
    }
}

/// Nanoseconds per unit of a duration key.
fn duration_scale(key: &str) -> f64 {
    match split_unit(key).1 {
        Some("ns") => 1.0,
        Some("µs") => 1e3,
        Some("ms") => 1e6,
        _ => 1e9,
    }
}

/// `v` with three significant digits (fewer decimals as it grows), then `unit`.
fn sig3(v: f64, unit: &str) -> String {
    let decimals = if v < 10.0 {
        2
    } else if v < 100.0 {
        1
    } else {
        0
    };
    format!("{v:.decimals$}{unit}")
}

/// `850ns`, `12.3µs`, `4.56ms`, `1.23s`, `2.50min`.
pub fn human_duration_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0}ns")
    } else if ns < 1e6 {
        sig3(ns / 1e3, "µs")
    } else if ns < 1e9 {
        sig3(ns / 1e6, "ms")
    } else if ns < 60e9 {
        sig3(ns / 1e9, "s")
    } else {
        sig3(ns / 60e9, "min")
    }
}

/// `512B`, `1.50KiB`, `325MiB`, `1.17GiB`.
pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024.0 {
        return format!("{bytes:.0}B");
    }
    let mut v = bytes / 1024.0;
    for unit in &UNITS[..UNITS.len() - 1] {
        if v < 1024.0 {
            return sig3(v, unit);
        }
        v /= 1024.0;
    }
    sig3(v, UNITS[UNITS.len() - 1])
}

/// `850B/s`, `12.5MB/s`, `3.35TB/s` (decimal units).
pub fn human_byte_rate(bytes_per_s: f64) -> String {
    const UNITS: [&str; 4] = ["kB/s", "MB/s", "GB/s", "TB/s"];
    if bytes_per_s < 1e3 {
        return format!("{bytes_per_s:.0}B/s");
    }
    let mut v = bytes_per_s / 1e3;
    for unit in &UNITS[..UNITS.len() - 1] {
        if v < 1e3 {
            return sig3(v, unit);
        }
        v /= 1e3;
    }
    sig3(v, UNITS[UNITS.len() - 1])
}

/// One cell: `v`, the value under JSON key `key`, shown the `show` way (`-` where missing).
pub fn cell(show: Show, key: &str, v: &Value) -> String {
    let text = match (show, v) {
        (_, Value::Null) => "-".to_string(),
        (Show::Bytes, Value::Number(n)) => human_bytes(n.as_f64().unwrap_or(0.0)),
        (Show::ByteRate, Value::Number(n)) => human_byte_rate(n.as_f64().unwrap_or(0.0)),
        (Show::Duration, Value::Number(n)) => {
            human_duration_ns(n.as_f64().unwrap_or(0.0) * duration_scale(key))
        }
        (Show::Number, Value::Number(n)) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(0.0);
            if x.fract() == 0.0 || x.abs() >= 100.0 {
                format!("{x:.0}")
            } else {
                format!("{x:.2}")
            }
        }
        (_, Value::String(s)) => s.clone(),
        (_, other) => other.to_string(),
    };
    // Keep the column split unambiguous (module docs).
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        if ch == ' ' && out.ends_with(' ') {
            continue;
        }
        out.push(if ch.is_control() { ' ' } else { ch });
    }
    if out.is_empty() { "-".into() } else { out }
}

/// Rows under a header, columns padded to their widest cell.
#[derive(Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with `columns`.
    pub fn new(columns: &[Column]) -> Self {
        Table {
            headers: columns.iter().map(header).collect(),
            right: columns.iter().map(|c| c.show != Show::Text).collect(),
            rows: Vec::new(),
        }
    }

    /// A two-column `FIELD VALUE` table (key/value listings: the field is the JSON path).
    pub fn fields() -> Self {
        Table {
            headers: vec!["FIELD".into(), "VALUE".into()],
            right: vec![false, false],
            rows: Vec::new(),
        }
    }

    /// One row of one JSON object, a cell per column.
    pub fn object_row(&mut self, columns: &[Column], object: &Value) {
        self.rows.push(
            columns
                .iter()
                .map(|c| cell(c.show, c.key, &object[c.key]))
                .collect(),
        );
    }

    /// One `FIELD VALUE` row: `path` is the field's dotted JSON path, `v` its value. The unit
    /// is the innermost path component's that has one (`e2e_us.p50` is in µs).
    pub fn field(&mut self, path: &str, show: Show, v: &Value) {
        let key = path
            .rsplit('.')
            .find(|c| split_unit(c).1.is_some())
            .unwrap_or(path);
        self.rows.push(vec![path.to_string(), cell(show, key, v)]);
    }

    /// `FIELD VALUE` rows for `paths` (dotted JSON paths into `v`), each shown its way.
    pub fn fields_of(&mut self, v: &Value, paths: &[(&str, Show)]) {
        for &(path, show) in paths {
            let pointer = format!("/{}", path.replace('.', "/"));
            self.field(path, show, v.pointer(&pointer).unwrap_or(&Value::Null));
        }
    }

    /// Rows so far.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, one line per row, header first, no trailing spaces.
    pub fn render(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain(std::iter::once(self.headers[i].chars().count()))
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.headers.len()).map(width).collect();
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, text) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i] - text.chars().count();
                if self.right[i] {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(text);
                } else {
                    line.push_str(text);
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    /// Print it to stdout.
    pub fn print(&self) {
        print!("{}", self.render());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_follow_keys() {
        assert_eq!(header(&col("p50_us", Show::Number)), "P50 (µs)");
        assert_eq!(header(&col("gpu_ns", Show::Duration)), "GPU");
        assert_eq!(header(&col("weight_bytes", Show::Bytes)), "WEIGHT");
        assert_eq!(header(&col("tokens_per_s", Show::Number)), "TOKENS (/s)");
        assert_eq!(header(&col("in_flight", Show::Number)), "IN FLIGHT");
    }

    #[test]
    fn human_scales() {
        assert_eq!(human_duration_ns(850.0), "850ns");
        assert_eq!(human_duration_ns(12_300.0), "12.3µs");
        assert_eq!(human_duration_ns(4.5e6), "4.50ms");
        assert_eq!(human_duration_ns(250e6), "250ms");
        assert_eq!(human_duration_ns(90e9), "1.50min");
        assert_eq!(human_bytes(512.0), "512B");
        assert_eq!(human_bytes(1536.0), "1.50KiB");
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.00GiB");
        assert_eq!(human_byte_rate(850.0), "850B/s");
        assert_eq!(human_byte_rate(3.35e12), "3.35TB/s");
        assert_eq!(human_byte_rate(882e9), "882GB/s");
    }

    #[test]
    fn columns_align() {
        let cols = [col("name", Show::Text), col("gpu_ns", Show::Duration)];
        let mut t = Table::new(&cols);
        t.object_row(&cols, &serde_json::json!({"name": "a", "gpu_ns": 1_500}));
        t.object_row(
            &cols,
            &serde_json::json!({"name": "longer  name", "gpu_ns": 2_000_000_000u64}),
        );
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        // Text left-aligned, numbers right-aligned, two spaces between columns; the doubled
        // space inside a cell is collapsed so columns still split on two spaces.
        assert_eq!(lines[0], "NAME            GPU");
        assert_eq!(lines[1], "a            1.50µs");
        assert_eq!(lines[2], "longer name   2.00s");
    }
}
