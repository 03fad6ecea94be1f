//! A request checked before anything is resolved or counted: the domain, the number of
//! descriptors and entries, every string's length, hits and overrides that cannot work. Every bad
//! request gets INVALID_ARGUMENT naming what is wrong; it must never panic on any input.

use tonic::Status;

use super::decider::Decider;
use super::plan::override_unit;
use crate::pb::RateLimitRequest;

/// A field's name, given as text or built on demand (no `format!` per entry on the happy path).
trait FieldName {
    fn name(self) -> String;
}

impl FieldName for &str {
    fn name(self) -> String {
        self.to_owned()
    }
}

impl<F: FnOnce() -> String> FieldName for F {
    fn name(self) -> String {
        self()
    }
}

impl Decider {
    /// Refuses a string longer than the cap, naming the field (built only when it is refused).
    fn check_length<F: FieldName>(&self, field: F, text: &str) -> Result<(), Status> {
        if text.len() <= self.config.max_string_bytes {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "{} is {} bytes, more than the {} allowed",
            field.name(),
            text.len(),
            self.config.max_string_bytes
        )))
    }

    pub(super) fn validate(&self, request: &RateLimitRequest) -> Result<(), Status> {
        if request.domain.is_empty() {
            return Err(Status::invalid_argument("domain must not be empty"));
        }
        self.check_length("domain", &request.domain)?;
        if request.descriptors.is_empty() {
            return Err(Status::invalid_argument("descriptors must not be empty"));
        }
        if request.descriptors.len() > self.config.max_descriptors {
            return Err(Status::invalid_argument(format!(
                "{} descriptors is more than the {} allowed in one request",
                request.descriptors.len(),
                self.config.max_descriptors
            )));
        }
        for (i, d) in request.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "descriptors[{i}] has no entries"
                )));
            }
            if d.entries.len() > self.config.max_entries {
                return Err(Status::invalid_argument(format!(
                    "descriptors[{i}] has {} entries, more than the {} allowed",
                    d.entries.len(),
                    self.config.max_entries
                )));
            }
            for (j, e) in d.entries.iter().enumerate() {
                if e.key.is_empty() {
                    return Err(Status::invalid_argument(format!(
                        "descriptors[{i}].entries[{j}].key must not be empty"
                    )));
                }
                self.check_length(|| format!("descriptors[{i}].entries[{j}].key"), &e.key)?;
                self.check_length(|| format!("descriptors[{i}].entries[{j}].value"), &e.value)?;
            }
            if let Some(limit) = &d.limit
                && override_unit(limit.unit).is_none()
            {
                return Err(Status::invalid_argument(format!(
                    "descriptors[{i}].limit.unit must be one of SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR (got {})",
                    limit.unit
                )));
            }
        }
        Ok(())
    }
}
