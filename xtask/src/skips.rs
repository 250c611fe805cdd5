//! Finding the tests that skipped in the output of `cargo test`, which
//! is still printed as it comes.
//!
//! **The convention** (every test of the workspace follows it): a test
//! that cannot run on this machine (not root, a tool missing) returns
//! early after printing one line that contains [`MARK`], as
//! `skipped: <reason>`, with `println!` or `eprintln!`. libtest captures
//! what a passing test prints and shows it only with `--show-output`, so
//! `cargo xtask test` passes that flag: every skip reaches the output,
//! under a `---- <test> stdout ----` header that names the test. Lines
//! printed outside the capture (child processes, raw writes to the file
//! descriptors) reach it too, without a name.
//!
//! CI runs as root with everything `setup` installs, so under `CI=true`
//! a skip is a broken install step and fails the run.
//!
//! The same scan keeps what each failing test printed last (libtest's
//! `failures:` section: its output, then its panic message), so that
//! `cargo xtask test` can say again, at the end of a long log, why each
//! test failed ([`Failure`]).

use std::io::{BufRead as _, BufReader, Read, Write};
use std::process::{Command, ExitStatus, Stdio};

use anyhow::{Context, Result};

use crate::sh;

/// What a skip line contains.
pub const MARK: &str = "skipped:";

/// One skip line, with the test whose output held it, when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    /// The test's name, from libtest's output header.
    pub test: Option<String>,
    /// The line, as printed.
    pub line: String,
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.test {
            Some(test) => write!(f, "{test}: {}", self.line.trim()),
            None => write!(f, "{}", self.line.trim()),
        }
    }
}

/// The end of what a failing test printed: its last lines of output
/// before the panic, and the panic's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The test's name, from libtest's output header.
    pub test: String,
    /// At most [`FAILURE_LINES`] lines, each cut at [`LINE_CHARS`].
    pub lines: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "---- {} ----", self.test)?;
        for l in &self.lines {
            writeln!(f, "{l}")?;
        }
        Ok(())
    }
}

/// Most lines kept of one failing test: its output's last
/// ([`OUTPUT_LINES`] at most), then the panic message (a backtrace is
/// left out).
pub const FAILURE_LINES: usize = 60;
/// Most lines kept of what a failing test printed before its panic.
pub const OUTPUT_LINES: usize = 15;
/// Longest line kept (characters).
pub const LINE_CHARS: usize = 2000;

/// What one output stream held: the skip lines and the failures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// The skip lines, in order.
    pub skips: Vec<Skip>,
    /// The failing tests, in order.
    pub failures: Vec<Failure>,
}

/// Reads one output stream line by line, remembering whose captured
/// output it is in, collecting the skip lines and what failing tests
/// printed.
#[derive(Debug, Default)]
pub struct Scanner {
    test: Option<String>,
    /// Inside libtest's `failures:` section (the headers name failed
    /// tests).
    in_failures: bool,
    /// The failing test's lines so far, and whether its backtrace began.
    failing: Option<(Failure, bool)>,
    found: Findings,
}

impl Scanner {
    /// Takes the next line (without its newline).
    pub fn line(&mut self, line: &str) {
        if let Some(test) = output_header(line) {
            self.end_failure();
            self.test = Some(test.to_owned());
            if self.in_failures {
                let f = Failure {
                    test: test.to_owned(),
                    lines: Vec::new(),
                };
                self.failing = Some((f, false));
            }
            return;
        }
        if ends_output_sections(line) {
            self.end_failure();
            self.test = None;
            self.in_failures = line == "failures:";
            return;
        }
        if is_skip(line) {
            self.found.skips.push(Skip {
                test: self.test.clone(),
                line: line.to_owned(),
            });
        }
        if let Some((f, in_backtrace)) = &mut self.failing {
            keep_failure_line(f, in_backtrace, line);
        }
    }

    fn end_failure(&mut self) {
        if let Some((f, _)) = self.failing.take() {
            self.found.failures.push(f);
        }
    }

    /// The skip lines and failures seen.
    pub fn finish(mut self) -> Findings {
        self.end_failure();
        self.found
    }
}

/// Adds `line` to a failing test's lines: after its panic, only the
/// message (up to the backtrace or libtest's note); before it, the last
/// lines of its output.
fn keep_failure_line(f: &mut Failure, in_backtrace: &mut bool, line: &str) {
    if *in_backtrace {
        return;
    }
    if line.starts_with("stack backtrace:") || line.starts_with("note: run with") {
        *in_backtrace = true;
        return;
    }
    let panicked = f.lines.iter().any(|l| l.contains(" panicked at "));
    if panicked && f.lines.len() >= FAILURE_LINES {
        return;
    }
    let cut: String = line.chars().take(LINE_CHARS).collect();
    f.lines.push(cut);
    if !panicked && f.lines.len() > OUTPUT_LINES && !line.contains(" panicked at ") {
        // Output before the panic: only its last lines.
        f.lines.remove(0);
    }
}

/// The test named by libtest's `---- <test> stdout ----` header.
fn output_header(line: &str) -> Option<&str> {
    line.strip_prefix("---- ")?.strip_suffix(" stdout ----")
}

/// libtest's lines after the captured outputs of one test binary.
fn ends_output_sections(line: &str) -> bool {
    matches!(line, "successes:" | "failures:")
        || line.starts_with("test result: ")
        || line.starts_with("running ")
}

/// Whether `line` reports a skip: it contains [`MARK`] not followed by
/// another colon (a module path such as `skipped::tests` is no skip).
pub fn is_skip(line: &str) -> bool {
    line.match_indices(MARK)
        .any(|(at, _)| !line[at + MARK.len()..].starts_with(':'))
}

/// Runs `cmd`, echoing it, with its stdout and stderr copied line by line
/// to this process's own as they come; returns its exit status and what
/// both held.
pub fn run_teed(cmd: &mut Command) -> Result<(ExitStatus, Findings)> {
    run_teed_to(cmd, std::io::stdout(), std::io::stderr())
}

/// [`run_teed`], copying to `out` and `err`.
fn run_teed_to(
    cmd: &mut Command,
    out: impl Write,
    err: impl Write + Send + 'static,
) -> Result<(ExitStatus, Findings)> {
    let line = sh::describe(cmd);
    eprintln!("$ {line}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{line}`"))?;
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let err_copy = std::thread::spawn(move || tee(stderr, err));
    let out_copy = tee(stdout, out);
    let err_copy = err_copy
        .join()
        .map_err(|_| anyhow::anyhow!("copying the stderr of `{line}` panicked"))?;
    let status = child
        .wait()
        .with_context(|| format!("cannot wait for `{line}`"))?;
    let mut found = out_copy.with_context(|| format!("cannot copy the stdout of `{line}`"))?;
    let err_found = err_copy.with_context(|| format!("cannot copy the stderr of `{line}`"))?;
    found.skips.extend(err_found.skips);
    found.failures.extend(err_found.failures);
    Ok((status, found))
}

/// Copies `from` to `to` line by line, scanning each line.
fn tee(from: impl Read, mut to: impl Write) -> std::io::Result<Findings> {
    let mut from = BufReader::new(from);
    let mut scanner = Scanner::default();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if from.read_until(b'\n', &mut buf)? == 0 {
            return Ok(scanner.finish());
        }
        to.write_all(&buf)?;
        to.flush()?;
        let text = String::from_utf8_lossy(&buf);
        scanner.line(text.trim_end_matches(['\n', '\r']));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Vec<String> {
        let mut scanner = Scanner::default();
        for line in text.lines() {
            scanner.line(line);
        }
        scanner.finish().skips.iter().map(Skip::to_string).collect()
    }

    /// `cargo test -- --show-output` of a binary with one skipping test,
    /// one passing test that prints, and a module named `skipped`.
    const SHOWN: &str = "\
running 3 tests
test skipped::tests::runs ... ok
test guard_denies_unassigned_gpus ... ok
test a_failed_replacement ... ok

successes:

---- guard_denies_unassigned_gpus stdout ----
skipped: not root

---- a_failed_replacement stdout ----
probing /dev/full
nothing was skipped here

successes:
    a_failed_replacement
    guard_denies_unassigned_gpus
    skipped::tests::runs

test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s

    skipped: strace is not installed (`cargo xtask setup` installs it)
";

    #[test]
    fn finds_skip_lines_and_names_their_tests() {
        assert_eq!(
            scan(SHOWN),
            [
                "guard_denies_unassigned_gpus: skipped: not root",
                "skipped: strace is not installed (`cargo xtask setup` installs it)",
            ]
        );
    }

    #[test]
    fn output_without_skips_has_none() {
        assert!(scan("running 1 test\ntest a ... ok\n\ntest result: ok.\n").is_empty());
        assert!(!is_skip("test skipped::a ... ok"));
        assert!(!is_skip("INFO ebpf attach mode skipped mode=kprobe"));
        assert!(is_skip("benchmark skipped: needs root"));
        assert!(is_skip("skipped::x then skipped: y"));
    }

    #[test]
    fn a_command_s_skips_on_both_streams_and_its_status_come_back() {
        // Copied to sinks, and spelt so that the command line (which
        // run_teed echoes) holds no skip line: printed, either would reach
        // the output of the `cargo xtask test` that runs this test.
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "m=skipped; echo '---- t stdout ----'; echo \"$m: a\"; echo \"$m: b\" >&2; exit 3",
        ]);
        let (status, found) = run_teed_to(&mut cmd, std::io::sink(), std::io::sink()).unwrap();
        assert_eq!(status.code(), Some(3));
        let found: Vec<String> = found.skips.iter().map(Skip::to_string).collect();
        assert_eq!(found, ["t: skipped: a", "skipped: b"]);
    }

    #[test]
    fn tee_copies_every_byte_and_scans_lines() {
        let input = "a\nskipped: no python3\r\nlast line without newline skipped: x";
        let mut copy = Vec::new();
        let found = tee(input.as_bytes(), &mut copy).unwrap();
        assert_eq!(copy, input.as_bytes());
        let lines: Vec<&str> = found.skips.iter().map(|s| s.line.as_str()).collect();
        assert_eq!(
            lines,
            [
                "skipped: no python3",
                "last line without newline skipped: x"
            ]
        );
    }

    /// `cargo test -- --show-output` of a binary with a passing test and
    /// two failing ones, one printing much before its panic.
    #[test]
    fn failures_keep_the_last_output_and_the_panic_message_without_the_backtrace() {
        let mut text = String::from(
            "running 3 tests\ntest a ... ok\ntest b ... FAILED\ntest c ... FAILED\n\nsuccesses:\n\n---- a stdout ----\nfine\n\nsuccesses:\n    a\n\nfailures:\n\n---- b stdout ----\n",
        );
        for k in 0..100 {
            text.push_str(&format!("second {k}\n"));
        }
        text.push_str("\nthread 'b' (7) panicked at agent/tests/b.rs:3:5:\nmean 40 over 25\nstack backtrace:\n   0: std::panicking\n\n---- c stdout ----\nthread 'c' (8) panicked at c.rs:1:1:\nboom\nnote: run with `RUST_BACKTRACE=1`\n\n\nfailures:\n    b\n    c\n\ntest result: FAILED. 1 passed; 2 failed\n");
        let mut scanner = Scanner::default();
        for line in text.lines() {
            scanner.line(line);
        }
        let found = scanner.finish();
        let names: Vec<&str> = found.failures.iter().map(|f| f.test.as_str()).collect();
        assert_eq!(names, ["b", "c"]);
        let b = &found.failures[0].lines;
        assert!(b.len() <= FAILURE_LINES, "{b:?}");
        assert_eq!(b.first().map(String::as_str), Some("second 86"), "{b:?}");
        assert_eq!(
            &b[b.len() - 3..],
            [
                "",
                "thread 'b' (7) panicked at agent/tests/b.rs:3:5:",
                "mean 40 over 25"
            ]
            .map(String::from)
            .as_slice()
        );
        assert!(!b.iter().any(|l| l.contains("std::panicking")), "{b:?}");
        assert_eq!(
            found.failures[1].lines,
            ["thread 'c' (8) panicked at c.rs:1:1:", "boom"]
        );
        assert!(found.skips.is_empty());
    }
}
