//! libFuzzer entry for `targets::rules_file` (the body, shared with `cargo test`, is in targets.rs).
#![no_main]

#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::rules_file(data));
