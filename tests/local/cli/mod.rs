//! The command line as a platform team uses it in CI: `portcullis check` on good and broken rule
//! directories, `portcullis explain`, and `portcullis ask` against a running replica.

mod ask;
mod check;
mod explain;
mod loading;

use crate::common::cli::{dir_with, portcullis, portcullis_with_env};

use std::path::Path;
