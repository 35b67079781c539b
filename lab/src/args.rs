//! The lab's tiny command line: `--quick` (smoke-test sizes) and `--help`.

/// Run-size options common to every experiment.
#[derive(Clone, Copy, Debug)]
pub struct LabArgs {
    /// Scale every loop down so the binary finishes in about a second (smoke tests).
    pub quick: bool,
}

impl LabArgs {
    /// Parses `std::env::args`; prints `usage` and exits on `--help` or an unknown flag.
    pub fn parse(usage: &str) -> Self {
        let mut quick = false;
        for arg in std::env::args().skip(1) {
            match arg.as_str() {
                "--quick" => quick = true,
                "-h" | "--help" => {
                    println!("{usage}\n\nOptions:\n  --quick   small sizes for a smoke test");
                    std::process::exit(0);
                }
                other => {
                    eprintln!("unknown argument `{other}`\n{usage}\n\nOptions:\n  --quick");
                    std::process::exit(2);
                }
            }
        }
        Self { quick }
    }

    /// `full` normally, `quick` under `--quick`.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}
