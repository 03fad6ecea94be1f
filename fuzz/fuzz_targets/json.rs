//! libFuzzer entry for `targets::json` (the body, shared with `cargo test`, is in targets.rs).
#![no_main]

#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::json(data));
