//! Rules under review: the tools a platform team runs on a rules repository before anything
//! serves it. `portcullis test` runs test files (which rule a descriptor meets; sequences of hits
//! on a virtual clock) through the code that serves, over the memory store; `portcullis diff`
//! says what a change does, rule by rule and case by case; `explain` shares their explanation.
//! Each decides as the deployment does (`mode`). It must never open a socket, read the host clock
//! or touch a shared store.

pub mod commands;
pub mod diff;
pub mod explain;
pub mod mode;
pub mod report;
pub mod run;
pub mod spec;
mod spec_yaml;
pub mod values;

pub use mode::Mode;
