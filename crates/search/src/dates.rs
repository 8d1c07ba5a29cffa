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
    // An anchored date with math after `||` (`2023-11-14||-1d/d`).
    if let Some((anchor, math)) = s.split_once("||") {
        let at = parse_date_str(anchor.trim(), now_ms)?;
        return now_math(math.trim(), at);
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

/// Elasticsearch's date math after `now` or `||`: `+N` / `-N` of a unit (s, m, h, d, w, M,
/// y) and `/unit` rounding down, in UTC, in any sequence.
fn now_math(mut rest: &str, now_ms: i64) -> Option<i64> {
    let mut t = now_ms;
    while !rest.is_empty() {
        let op = rest.as_bytes()[0];
        rest = &rest[1..];
        if op == b'/' {
            let unit = rest.chars().next()?;
            rest = &rest[unit.len_utf8()..];
            t = round_down(t, unit)?;
            continue;
        }
        let sign = match op {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: i64 = if digits == 0 {
            1
        } else {
            rest[..digits].parse().ok()?
        };
        rest = &rest[digits..];
        let unit = rest.chars().next()?;
        rest = &rest[unit.len_utf8()..];
        let fixed = match unit {
            's' => 1_000,
            'm' => 60_000,
            'h' | 'H' => 3_600_000,
            'd' => 86_400_000,
            'w' => 7 * 86_400_000,
            'M' | 'y' => {
                let months = if unit == 'y' { 12 * n } else { n };
                t = add_months(t, sign * months)?;
                continue;
            }
            _ => return None,
        };
        t = t.checked_add(sign * n.checked_mul(fixed)?)?;
    }
    Some(t)
}

fn utc(ms: i64) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()
}

/// `ms` rounded down to the start of its `unit` (weeks start on Monday).
fn round_down(ms: i64, unit: char) -> Option<i64> {
    let t = utc(ms)?;
    let day = t.date();
    let start = match unit {
        's' => return Some(ms.div_euclid(1_000) * 1_000),
        'm' => return Some(ms.div_euclid(60_000) * 60_000),
        'h' | 'H' => return Some(ms.div_euclid(3_600_000) * 3_600_000),
        'd' => day,
        'w' => day - time::Duration::days(i64::from(day.weekday().number_days_from_monday())),
        'M' => day.replace_day(1).ok()?,
        'y' => time::Date::from_calendar_date(day.year(), time::Month::January, 1).ok()?,
        _ => return None,
    };
    millis(start.midnight().assume_utc())
}

/// `ms` moved by whole calendar months, the day kept where the month has it (else its last).
fn add_months(ms: i64, months: i64) -> Option<i64> {
    let t = utc(ms)?;
    let total = i64::from(t.year()) * 12 + i64::from(u8::from(t.month()) - 1) + months;
    let year = i32::try_from(total.div_euclid(12)).ok()?;
    let month = time::Month::try_from(u8::try_from(total.rem_euclid(12) + 1).ok()?).ok()?;
    let last = month.length(year);
    let date = time::Date::from_calendar_date(year, month, t.day().min(last)).ok()?;
    millis(t.replace_date(date))
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
    fn date_math_rounds_and_moves_by_calendar_units_after_now_or_an_anchor() {
        let at = |s: &str| parse_date(&json!(s), 0).unwrap();
        // 2023-11-14T10:30:00Z, a Tuesday.
        let now = at("2023-11-14T10:30:00Z");
        let math = |s: &str| parse_date(&json!(s), now).unwrap();
        assert_eq!(math("now/d"), at("2023-11-14T00:00:00Z"));
        assert_eq!(math("now-1d/d"), at("2023-11-13T00:00:00Z"));
        assert_eq!(
            math("now/w"),
            at("2023-11-13T00:00:00Z"),
            "weeks start on Monday"
        );
        assert_eq!(math("now/M"), at("2023-11-01T00:00:00Z"));
        assert_eq!(math("now/y"), at("2023-01-01T00:00:00Z"));
        assert_eq!(math("now-3M"), at("2023-08-14T10:30:00Z"));
        assert_eq!(
            math("2024-01-31||+1M"),
            at("2024-02-29T00:00:00Z"),
            "clamped to the month's end"
        );
        assert_eq!(math("2023-11-14||-1d/d"), at("2023-11-13T00:00:00Z"));
        assert_eq!(math("now+1h/h"), at("2023-11-14T11:00:00Z"));
        assert!(parse_date(&json!("now/q"), now).is_none());
        assert!(parse_date(&json!("2023-11-14||*1d"), now).is_none());
    }

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
