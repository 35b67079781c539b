//! The lab's tiny command line: `--quick` (smoke-test sizes) and `--help`.

/// Run-size options common to every experiment.
#[derive(Clone, Debug)]
pub struct LabArgs {
    /// Scale every loop down so the binary finishes in about a second (smoke tests).
    pub quick: bool,
    /// Experiment-specific switches that were given (from the `extra` list of [`Self::parse_with`]).
    pub flags: Vec<&'static str>,
}

impl LabArgs {
    /// Parses `std::env::args`; prints `usage` and exits on `--help` or an unknown flag.
    pub fn parse(usage: &str) -> Self {
        Self::parse_with(usage, &[])
    }

    /// Like [`Self::parse`], also accepting the switches in `extra` (`(flag, help)` pairs).
    pub fn parse_with(usage: &str, extra: &[(&'static str, &str)]) -> Self {
        let mut help = String::from("Options:\n  --quick   small sizes for a smoke test");
        for (flag, text) in extra {
            help.push_str(&format!("\n  {flag}   {text}"));
        }
        let mut quick = false;
        let mut flags = Vec::new();
        for arg in std::env::args().skip(1) {
            match arg.as_str() {
                "--quick" => quick = true,
                "-h" | "--help" => {
                    println!("{usage}\n\n{help}");
                    std::process::exit(0);
                }
                other => match extra.iter().find(|(flag, _)| *flag == other) {
                    Some((flag, _)) => flags.push(*flag),
                    None => {
                        eprintln!("unknown argument `{other}`\n{usage}\n\n{help}");
                        std::process::exit(2);
                    }
                },
            }
        }
        Self { quick, flags }
    }

    /// True if the experiment-specific switch `flag` was given.
    pub fn has(&self, flag: &str) -> bool {
        self.flags.contains(&flag)
    }

    /// `full` normally, `quick` under `--quick`.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}
