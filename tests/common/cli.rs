//! The binary as a platform team's CI runs it: exit code and everything it printed, and rule or
//! test directories written for one test.

use std::path::Path;
use std::process::Command;

/// Runs `portcullis ARGS`: its exit code, stdout then stderr.
pub fn portcullis(args: &[&str]) -> (i32, String) {
    portcullis_with_env(args, &[])
}

/// `portcullis` with `envs` added to its environment; a command that does not exit by itself
/// (a `serve` that starts) is stopped after 10 s and answers -1.
pub fn portcullis_with_env(args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new("timeout")
        .arg("10")
        .arg(env!("CARGO_BIN_EXE_portcullis"))
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .expect("run portcullis");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // timeout(1) answers 124 when it had to stop the command.
    let code = out.status.code().filter(|c| *c != 124).unwrap_or(-1);
    (code, text)
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
