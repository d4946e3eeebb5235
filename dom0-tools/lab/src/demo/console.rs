//! What the demo says while it runs: step headings, notes and one live progress line on
//! stderr; tables on stdout (on stderr too with `--json`, whose stdout is the document).

use std::io::{IsTerminal, Write};

/// The demo's output.
pub struct Console {
    json: bool,
    live: bool,
    /// A progress line is showing (terminal only) and must be cleared before other text.
    progress_shown: bool,
}

impl Console {
    /// `json`: stdout is reserved for the final document.
    pub fn new(json: bool) -> Console {
        Console {
            json,
            live: std::io::stderr().is_terminal(),
            progress_shown: false,
        }
    }

    fn clear_progress(&mut self) {
        if self.progress_shown {
            eprint!("\r\x1b[K");
            self.progress_shown = false;
        }
    }

    /// The heading of step `n` of `total`.
    pub fn heading(&mut self, n: usize, total: usize, title: &str) {
        self.clear_progress();
        eprintln!("\n== [{n}/{total}] {title}");
    }

    /// A line of commentary.
    pub fn note(&mut self, text: &str) {
        self.clear_progress();
        eprintln!("   {text}");
    }

    /// The live progress line: redrawn in place on a terminal, one line each otherwise.
    pub fn progress(&mut self, text: &str) {
        if self.live {
            eprint!("\r\x1b[K   {text}");
            let _ = std::io::stderr().flush();
            self.progress_shown = true;
        } else {
            eprintln!("   {text}");
        }
    }

    /// Results for the reader: stdout, or stderr when stdout carries the JSON document.
    pub fn show(&mut self, text: &str) {
        self.clear_progress();
        let text = text.trim_end_matches('\n');
        if self.json {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }

    /// Leave the terminal on a fresh line.
    pub fn finish(&mut self) {
        self.clear_progress();
    }
}
