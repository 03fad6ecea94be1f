//! Wildcard values: `*` matches zero or more characters, anywhere in the value and any number of
//! times (`/api/*/users/*`). No other character is special, so values are never regexes.

/// Whether `pattern` (with `*` wildcards) matches all of `text`. Linear in practice: on a mismatch
/// it retries from the last `*` only, which is enough for `*` (no character classes).
pub fn matches(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut last_star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            last_star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((star, matched)) = last_star {
            // Let the last `*` swallow one more character and try again from there.
            pi = star + 1;
            ti = matched + 1;
            last_star = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Whether every value `pattern` matches is also matched by `cover` (so a `cover` tried first
/// leaves `pattern` unused). `cover`'s `*` may stand for any run of `pattern`'s characters and
/// stars; a literal of `cover` must meet the same literal in `pattern`, never a star.
pub fn covers(cover: &str, pattern: &str) -> bool {
    let (c, p) = (cover.as_bytes(), pattern.as_bytes());
    // at[j]: whether cover[..i] can produce pattern[..j]; one row per cover position.
    let mut at = vec![false; p.len() + 1];
    at[0] = true;
    for &symbol in c {
        let mut next = vec![false; p.len() + 1];
        if symbol == b'*' {
            let mut reachable = false;
            for j in 0..=p.len() {
                reachable |= at[j];
                next[j] = reachable;
            }
        } else {
            for j in 0..p.len() {
                next[j + 1] = at[j] && p[j] == symbol;
            }
        }
        at = next;
    }
    at[p.len()]
}

#[cfg(test)]
mod tests {
    use super::{covers, matches};

    #[test]
    fn a_pattern_covers_another_when_it_matches_all_it_matches() {
        assert!(covers("*", "/api/*"));
        assert!(covers("/api/*", "/api/v1/*"));
        assert!(covers("*.png", "/img/*.png"));
        assert!(covers("a*c", "ab*c"));
        assert!(!covers("/api/v1/*", "/api/*"));
        assert!(!covers("a*c", "a*"));
        assert!(!covers("/api/*/x", "/api/*"));
        assert!(covers("/api/*", "/api/*"));
    }

    #[test]
    fn star_matches_zero_or_more_anywhere() {
        assert!(matches("*", ""));
        assert!(matches("*", "anything"));
        assert!(matches("foo*", "foo"));
        assert!(matches("foo*", "foobar"));
        assert!(!matches("foo*", "fo"));
        assert!(matches("*bar", "foobar"));
        assert!(!matches("*bar", "barfoo"));
        assert!(matches("/api/*/users/*", "/api/v1/users/42"));
        assert!(matches("/api/*/users/*", "/api//users/"));
        assert!(!matches("/api/*/users/*", "/api/v1/groups/42"));
        assert!(matches("a*b*c", "aXXbYYbZc"));
        assert!(!matches("a*b*c", "aXXbYYbZ"));
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exactly"));
        assert!(matches("é*", "été"));
    }

    #[test]
    fn many_stars_stay_fast() {
        let text = "a".repeat(10_000);
        let pattern = format!("{}b", "*a".repeat(50));
        assert!(!matches(&pattern, &text));
    }
}
