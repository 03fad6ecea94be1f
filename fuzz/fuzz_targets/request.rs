//! libFuzzer entry for `targets::request` (the body, shared with `cargo test`, is in targets.rs).
#![no_main]

#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::request(data));
