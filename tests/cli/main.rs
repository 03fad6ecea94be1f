//! The command line as a platform team uses it in CI: `portcullis check` on good and broken rule
//! directories, and `portcullis explain`.

mod check;
#[path = "../common/mod.rs"]
mod common;
mod explain;
mod loading;

use common::cli::{dir_with, portcullis};

use std::path::Path;
