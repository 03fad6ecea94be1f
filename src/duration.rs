//! One syntax for a length of time wherever Portcullis reads one: flags, `PORTCULLIS_*` variables,
//! the Go service's variables and rules test files. Written as people write them: `15ms`, `2s`,
//! `1.5s`, `1m`, `24h`, `1d`, Go's `1h30m`. It must never guess a unit: a bare number other than
//! `0` is refused, naming what to write instead.

use std::time::Duration;

/// A text that is not a duration, with what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a duration: {why} (write it like 15ms, 2s, 1.5s, 1m, 24h, 1d or 1h30m)")]
pub struct BadDuration {
    pub text: String,
    pub why: &'static str,
}

/// The longest duration accepted: a century (past it a setting means something else).
const MAX_SECONDS: f64 = 100.0 * 365.0 * 86_400.0;

/// Units and their length in nanoseconds, longest names first where one is a prefix of another.
const UNITS: &[(&str, f64)] = &[
    ("ns", 1.0),
    ("us", 1e3),
    ("µs", 1e3),
    ("ms", 1e6),
    ("s", 1e9),
    ("m", 60e9),
    ("h", 3_600e9),
    ("d", 86_400e9),
];

/// Parses `text` as one or more `<number><unit>` parts (`1h30m`, `1.5s`), or `0`.
pub fn parse(text: &str) -> Result<Duration, BadDuration> {
    let bad = |why| BadDuration {
        text: text.to_owned(),
        why,
    };
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad("it is empty"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total_ns = 0.0_f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad("a part does not start with a number"));
        }
        let value: f64 = rest[..digits]
            .parse()
            .map_err(|_| bad("a number is malformed"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = rest[..unit_len].trim();
        if unit.is_empty() {
            return Err(bad("a number has no unit"));
        }
        let scale = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, ns)| *ns)
            .ok_or_else(|| bad("the unit is none of ns, us, ms, s, m, h, d"))?;
        rest = &rest[unit_len..];
        total_ns += value * scale;
    }
    if !total_ns.is_finite() || total_ns / 1e9 > MAX_SECONDS {
        return Err(bad("it is longer than a century"));
    }
    Ok(Duration::from_nanos(total_ns.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        let ms = Duration::from_millis;
        assert_eq!(parse("15ms"), Ok(ms(15)));
        assert_eq!(parse("2s"), Ok(ms(2_000)));
        assert_eq!(parse(" 1.5s "), Ok(ms(1_500)));
        assert_eq!(parse("1m"), Ok(ms(60_000)));
        assert_eq!(parse("24h"), Ok(ms(86_400_000)));
        assert_eq!(parse("1d"), Ok(ms(86_400_000)));
        assert_eq!(parse("1h30m"), Ok(ms(5_400_000)));
        assert_eq!(parse("2m30.5s"), Ok(ms(150_500)));
        assert_eq!(parse("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse("250µs"), Ok(Duration::from_micros(250)));
        assert_eq!(parse("10ns"), Ok(Duration::from_nanos(10)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("0.1s"), Ok(ms(100)));
    }

    #[test]
    fn a_bare_number_or_an_unknown_unit_is_refused_saying_what_to_write() {
        for text in [
            "30", "1.5", "", "s", "-1s", "1w", "1..5s", "1e3s", "200y", "h1",
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.to_string().contains("15ms, 2s"), "{e}");
        }
        assert!(parse("30").unwrap_err().why.contains("no unit"));
        assert!(parse("1000000000h").unwrap_err().why.contains("century"));
    }
}
