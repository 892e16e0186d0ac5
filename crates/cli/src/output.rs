//! Output: one JSON or YAML document per command (the API's types as the
//! daemon sent them), or aligned text for people. Everything the commands
//! print goes through [`out!`] and [`outln!`], never `print!`, which panics
//! when stdout is a pipe nobody reads any more (`lamina ... | head -n 1`).

use anyhow::{Context, Result};
use serde::Serialize;
use std::io::Write;

/// `print!` to stdout, ending the command quietly when its reader is gone
/// (see [`write_stdout`]).
macro_rules! out {
    ($($t:tt)*) => { $crate::output::write_stdout(format_args!($($t)*)) };
}

/// `println!` to stdout, as [`out!`].
macro_rules! outln {
    () => { $crate::output::write_stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::output::write_stdout(format_args!("{}\n", format_args!($($t)*))) };
}

pub(crate) use {out, outln};

/// Write to stdout. When that fails because the reader closed the pipe,
/// the command ends as `cat` does: killed by SIGPIPE, with no message (a
/// shell reports status 141, and nothing else); any other failure is an
/// error message and status 1. Either way the command has done its work:
/// only its output is cut short.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        stdout_failed(e);
    }
}

/// Flush stdout (its last line may be buffered), as [`write_stdout`] writes.
pub fn flush_stdout() {
    if let Err(e) = std::io::stdout().lock().flush() {
        stdout_failed(e);
    }
}

fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // Rust's runtime ignores SIGPIPE (so that a write to a closed pipe
        // or socket is an error, not a death); restore the default action
        // and take the signal, as a command that never changed it would.
        // SAFETY: signal() and raise() with a standard signal and the
        // default disposition touch no Rust-managed state; the process
        // ends at raise().
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::raise(libc::SIGPIPE);
        }
        std::process::exit(128 + libc::SIGPIPE);
    }
    let _ = writeln!(std::io::stderr(), "error: writing the output: {e}");
    std::process::exit(1);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Json,
    Yaml,
    Table,
}

/// Print `value` as one JSON or YAML document; in table mode print what
/// `table` makes of it.
pub fn show<T: Serialize>(fmt: Format, value: &T, table: impl FnOnce(&T) -> String) -> Result<()> {
    match fmt {
        Format::Json | Format::Yaml => document(fmt, value),
        Format::Table => {
            let s = table(value);
            out!("{s}");
            if !s.is_empty() && !s.ends_with('\n') {
                outln!();
            }
            Ok(())
        }
    }
}

/// Print `value` as one JSON document (pretty) or one YAML document.
pub fn document<T: Serialize>(fmt: Format, value: &T) -> Result<()> {
    match fmt {
        Format::Yaml => out!(
            "{}",
            serde_yaml::to_string(value).context("formatting YAML")?
        ),
        _ => outln!(
            "{}",
            serde_json::to_string_pretty(value).context("formatting JSON")?
        ),
    }
    Ok(())
}

/// A note beside the output: with the text in table mode, on stderr in
/// JSON and YAML mode (stdout holds only the document there).
pub fn note(fmt: Format, line: &str) {
    match fmt {
        Format::Table => outln!("{line}"),
        // A note is not worth a failure: a closed stderr drops it.
        _ => {
            let _ = writeln!(std::io::stderr(), "note: {line}");
        }
    }
}

/// Items joined with commas, or `-` for none.
pub fn list_or_dash(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(", ")
    }
}

/// Columns padded to their widest cell, two spaces apart.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            rows: vec![headers.iter().map(|h| h.to_string()).collect()],
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; cols];
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in &self.rows {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate() {
                line.push_str(c);
                if i + 1 < r.len() {
                    let pad = widths[i] - c.chars().count() + 2;
                    line.push_str(&" ".repeat(pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `Key:  value` lines, keys aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let w = pairs
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0)
        + 1;
    let mut out = String::new();
    for (k, v) in pairs {
        out.push_str(&format!("{:<w$}  {v}\n", format!("{k}:")));
    }
    out
}

/// `-` for nothing.
pub fn or_dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_string()
}

/// At most `max` characters, with `...` when cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(3)).collect();
        t.push_str("...");
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns() {
        let mut t = Table::new(&["NAME", "SIZE"]);
        t.row(vec!["a-long-name".into(), "1.0 GiB".into()]);
        t.row(vec!["b".into(), "-".into()]);
        assert_eq!(
            t.render(),
            "NAME         SIZE\na-long-name  1.0 GiB\nb            -\n"
        );
    }

    /// `print!` panics on a closed pipe: nothing in the command uses it.
    #[test]
    fn commands_print_only_through_out() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut found = vec![];
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                for (at, _) in code.match_indices("print") {
                    let before = code[..at].chars().last();
                    let after = &code[at + 5..];
                    if before != Some('e') && (after.starts_with("!(") || after.starts_with("ln!("))
                    {
                        found.push(format!("{}:{}", path.display(), i + 1));
                    }
                }
            }
        }
        assert!(found.is_empty(), "print! or println! at {found:?}");
    }

    #[test]
    fn clips() {
        assert_eq!(clip("abcdef", 6), "abcdef");
        assert_eq!(clip("abcdefg", 6), "abc...");
    }

    #[test]
    fn fields_align() {
        assert_eq!(
            fields(&[
                ("Name", "v".into()),
                ("Size", "1 B".into()),
                ("Clone state", "none".into())
            ]),
            "Name:         v\nSize:         1 B\nClone state:  none\n"
        );
    }
}
