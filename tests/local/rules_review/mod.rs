//! `portcullis test` and `portcullis diff` as a platform team runs them in CI on its rules
//! repository: passing suites, a broken rule caught with both file:lines, unusable test files
//! refused with theirs, JUnit read back, every kind of change a diff reports, and the exit codes
//! a pipeline branches on.

use crate::common;
mod docs;
mod files;
mod shipped;

use shipped::halved_examples;

use crate::common::cli::{dir_with, portcullis, s};

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The line of `needle` in `text`, 1-based.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the text"))
        + 1
}
