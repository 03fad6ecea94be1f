//! The small value syntaxes of a test file: a limit as `5/minute`, a time as `1.5s` or `2m` (the
//! one duration syntax of `crate::duration`), a descriptor entry as `key=value`. Each parser says
//! what it expected; none guesses.

use crate::rules::Unit;

/// `5/minute` (also `5 per minute`): requests per unit.
pub fn parse_rate(text: &str) -> Result<(u32, Unit), String> {
    let bad = || format!("{text:?} is not a limit like 5/minute");
    let (count, unit) = text
        .split_once('/')
        .or_else(|| text.split_once(" per "))
        .ok_or_else(bad)?;
    let count: u32 = count.trim().parse().map_err(|_| bad())?;
    let unit = Unit::parse(unit.trim()).ok_or_else(bad)?;
    Ok((count, unit))
}

/// `250ms`, `12s`, `1.5s`, `2m`, `1h`, `1d` (`crate::duration`'s one syntax): microseconds.
pub fn parse_time_us(text: &str) -> Result<u64, String> {
    let time = crate::duration::parse(text).map_err(|e| e.to_string())?;
    u64::try_from(time.as_micros()).map_err(|_| format!("{text:?} is too long"))
}

/// `key=value` (`key=` for an empty value).
pub fn parse_entry(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not key=value")),
    }
}

/// `5/minute`, as the test file writes it.
pub fn show_rate(count: u32, unit: Unit) -> String {
    format!("{count}/{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_times_and_entries_parse_or_say_what_was_expected() {
        assert_eq!(parse_rate("5/minute"), Ok((5, Unit::Minute)));
        assert_eq!(parse_rate("20 per Second"), Ok((20, Unit::Second)));
        assert!(parse_rate("5/fortnight").unwrap_err().contains("5/minute"));
        assert!(parse_rate("-1/hour").is_err());
        assert_eq!(parse_time_us("1.5s"), Ok(1_500_000));
        assert_eq!(parse_time_us("250ms"), Ok(250_000));
        assert_eq!(parse_time_us("2m"), Ok(120_000_000));
        assert_eq!(parse_time_us("1h30m"), Ok(5_400_000_000));
        assert!(parse_time_us("12").unwrap_err().contains("no unit"));
        assert!(parse_time_us("-1s").is_err());
        assert!(parse_time_us("soon").is_err());
        assert_eq!(parse_entry("path="), Ok(("path".into(), String::new())));
        assert_eq!(parse_entry("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_entry("=v").is_err());
    }
}
