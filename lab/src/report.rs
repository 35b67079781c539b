//! Markdown tables: the last thing every experiment prints.

/// A markdown table built row by row.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells print empty, extra cells are kept).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders the table as markdown.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        out.push_str(&line(&self.headers));
        out.push_str(&line(&vec!["---".to_owned(); self.headers.len()]));
        for r in &self.rows {
            let mut cells = r.clone();
            cells.resize(cells.len().max(self.headers.len()), String::new());
            out.push_str(&line(&cells));
        }
        out
    }

    /// Prints the table to stdout.
    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// Formats a float with `digits` decimals.
pub fn f(value: f64, digits: usize) -> String {
    format!("{value:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_markdown() {
        let mut t = Table::new(&["a", "b"]);
        t.row(vec!["1".into()]);
        assert_eq!(t.render(), "| a | b |\n| --- | --- |\n| 1 |  |\n");
    }
}
