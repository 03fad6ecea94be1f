//! Why rules were refused: each problem with its file, line and field, and every problem of a
//! set at once, so that `portcullis check` lists them all. It must never lose a problem's place.

use std::fmt;
use std::path::PathBuf;

/// One problem in one rules file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {field}: {message}", file.display())]
pub struct RuleError {
    pub file: PathBuf,
    pub line: u64,
    /// The YAML path of the offending field, e.g. `descriptors[0].rate_limit.unit`.
    pub field: String,
    pub message: String,
}

/// Why a set of rules was refused: every problem found.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("cannot read rules directory {}: {source}", dir.display())]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", Invalid(.0))]
    Invalid(Vec<RuleError>),
}

struct Invalid<'a>(&'a [RuleError]);

impl fmt::Display for Invalid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}
