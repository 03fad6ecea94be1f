//! The binary as a platform team's CI runs it: exit code and everything it printed, and rule or
//! test directories written for one test.

use std::path::Path;
use std::process::Command;

/// Runs `portcullis ARGS`: its exit code, stdout then stderr.
pub fn portcullis(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(args)
        .output()
        .expect("run portcullis");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A temporary directory holding `files` (names may have folders).
pub fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    dir
}

pub fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}
