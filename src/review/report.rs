//! What `portcullis test` prints: one line per failing case (the test file:line, the case, what
//! was expected and what happened, the rule's file:line) and a summary; and the same results as
//! JUnit XML for CI systems. JUnit is a handful of elements, written here rather than through
//! an XML crate the sidecar would carry for this alone. It must never hide a failure.

use std::fmt::Write as _;
use std::path::Path;

use super::run::Outcome;

/// The results of one test file.
pub struct FileResults<'a> {
    pub path: &'a Path,
    pub outcomes: Vec<Outcome>,
}

/// The failing lines and the summary line.
pub fn text(results: &[FileResults<'_>]) -> String {
    let mut out = String::new();
    let (mut cases, mut failed) = (0, 0);
    for file in results {
        for o in &file.outcomes {
            cases += 1;
            if let Some(failure) = &o.failure {
                failed += 1;
                let rule = o
                    .rule
                    .as_ref()
                    .map_or(String::new(), |r| format!(" [rule {r}]"));
                let _ = writeln!(
                    out,
                    "{}:{}: FAIL {:?}: {failure}{rule}",
                    file.path.display(),
                    o.line,
                    o.name
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "{cases} case(s) in {} file(s): {} passed, {failed} failed",
        results.len(),
        cases - failed
    );
    out
}

/// JUnit XML: one `testsuite` per test file, one `testcase` per case.
pub fn junit(results: &[FileResults<'_>]) -> String {
    let total: usize = results.iter().map(|f| f.outcomes.len()).sum();
    let failures = |outcomes: &[Outcome]| outcomes.iter().filter(|o| o.failure.is_some()).count();
    let all_failed: usize = results.iter().map(|f| failures(&f.outcomes)).sum();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"portcullis test\" tests=\"{total}\" failures=\"{all_failed}\">"
    );
    for file in results {
        let path = escape(&file.path.display().to_string());
        let _ = writeln!(
            out,
            "  <testsuite name=\"{path}\" tests=\"{}\" failures=\"{}\">",
            file.outcomes.len(),
            failures(&file.outcomes)
        );
        for o in &file.outcomes {
            let _ = write!(
                out,
                "    <testcase name=\"{}\" classname=\"{path}\" file=\"{path}\" line=\"{}\"",
                escape(&o.name),
                o.line
            );
            match &o.failure {
                None => out.push_str("/>\n"),
                Some(failure) => {
                    let rule = o
                        .rule
                        .as_deref()
                        .map_or(String::new(), |r| format!(" [rule {r}]"));
                    let message = escape(&format!("{failure}{rule}"));
                    let _ = writeln!(
                        out,
                        ">\n      <failure message=\"{message}\">{path}:{}: {message}</failure>\n    </testcase>",
                        o.line
                    );
                }
            }
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

/// Text and attribute escaping; control characters XML 1.0 cannot carry become spaces.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => out.push(' '),
            c => out.push(c),
        }
    }
    out
}
