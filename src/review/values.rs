//! The small value syntaxes of a test file: a limit as `5/minute`, a time as `1.5s` or `2m`, a
//! descriptor entry as `key=value`. Each parser says what it expected; none guesses.

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

/// `250ms`, `12s`, `1.5s`, `2m`, `1h`, `1d`, or a bare number of seconds: microseconds.
pub fn parse_time_us(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a time like 500ms, 12s, 1.5s, 2m, 1h or 1d");
    let text = text.trim();
    let (number, scale_us) = [
        ("ms", 1_000.0),
        ("s", 1e6),
        ("m", 60e6),
        ("h", 3_600e6),
        ("d", 86_400e6),
    ]
    .iter()
    .find_map(|(suffix, scale)| text.strip_suffix(suffix).map(|n| (n, *scale)))
    .unwrap_or((text, 1e6));
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    let us = (value * scale_us).round();
    // Beyond a few centuries a test means something else.
    if us > 1e16 {
        return Err(bad());
    }
    Ok(us as u64)
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
        assert_eq!(parse_time_us("12"), Ok(12_000_000));
        assert!(parse_time_us("-1s").is_err());
        assert!(parse_time_us("soon").is_err());
        assert_eq!(parse_entry("path="), Ok(("path".into(), String::new())));
        assert_eq!(parse_entry("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_entry("=v").is_err());
    }
}
