//! Dates as search accepts them: epoch milliseconds (number or digits), RFC 3339, a plain
//! `YYYY-MM-DD` (midnight UTC), and `now` with `+`/`-` offsets in s, m, h, d (`now-15m`).

use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Epoch milliseconds of a date value, or `None` when it is not one.
pub fn parse_date(v: &Value, now_ms: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => parse_date_str(s.trim(), now_ms),
        _ => None,
    }
}

fn parse_date_str(s: &str, now_ms: i64) -> Option<i64> {
    if let Some(rest) = s.strip_prefix("now") {
        return now_math(rest, now_ms);
    }
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'-') && !s.contains("--") {
        if let Ok(n) = s.parse::<i64>() {
            return Some(n);
        }
    }
    if let Ok(t) = OffsetDateTime::parse(s, &Rfc3339) {
        return millis(t);
    }
    let day = format!("{s}T00:00:00Z");
    OffsetDateTime::parse(&day, &Rfc3339).ok().and_then(millis)
}

/// Epoch milliseconds as RFC 3339 in UTC with milliseconds (`2023-11-14T22:13:20.000Z`), as
/// Elasticsearch renders a date field's value.
pub fn rfc3339_millis(ms: i64) -> Option<String> {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()?;
    Some(format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    ))
}

fn millis(t: OffsetDateTime) -> Option<i64> {
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

fn now_math(mut rest: &str, now_ms: i64) -> Option<i64> {
    let mut t = now_ms;
    while !rest.is_empty() {
        let sign = match rest.as_bytes()[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        rest = &rest[1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest.chars().next()?;
        rest = &rest[unit.len_utf8()..];
        let ms = match unit {
            's' => 1_000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            'w' => 7 * 86_400_000,
            _ => return None,
        };
        t = t.checked_add(sign * n.checked_mul(ms)?)?;
    }
    Some(t)
}

/// RFC 3339 text of epoch milliseconds (for `key_as_string` and `_source` dates).
pub fn format_millis(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dates_parse_from_every_accepted_form() {
        assert_eq!(parse_date(&json!(1000), 0), Some(1000));
        assert_eq!(parse_date(&json!("1000"), 0), Some(1000));
        assert_eq!(parse_date(&json!("1970-01-01T00:00:01Z"), 0), Some(1000));
        assert_eq!(parse_date(&json!("1970-01-02"), 0), Some(86_400_000));
        assert_eq!(parse_date(&json!("now-1m"), 120_000), Some(60_000));
        assert_eq!(parse_date(&json!("now+1h-1s"), 0), Some(3_599_000));
        assert_eq!(parse_date(&json!("yesterday"), 0), None);
        assert_eq!(parse_date(&json!(true), 0), None);
    }
}
