//! date_histogram's `time_zone`: parsing it as Elasticsearch does, and rounding instants to
//! the start of their local unit (day, week, month, quarter, year, or a fixed length on the
//! local clock) in it, DST changes included (jiff's time-zone rules).

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{Offset, TimeZone};
use jiff::{Timestamp, ToSpan};

use crate::error::SearchError;

/// A `time_zone` as Elasticsearch takes it: an IANA name (`Europe/Paris`), an offset from UTC
/// (`+01:00`, `-0530`, `+01`), or `UTC` / `Z`.
pub fn parse(text: &str) -> Result<TimeZone, SearchError> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("utc") || t == "Z" || t.eq_ignore_ascii_case("gmt") {
        return Ok(TimeZone::UTC);
    }
    if let Some(sign) = t
        .strip_prefix('+')
        .map(|r| (1, r))
        .or_else(|| t.strip_prefix('-').map(|r| (-1, r)))
    {
        let (sign, rest) = sign;
        // HH, HHMM or HH:MM.
        let digits: String = match rest.as_bytes().get(2) {
            Some(b':') if rest.len() == 5 => rest.replacen(':', "", 1),
            _ => rest.to_string(),
        };
        let bad = || {
            SearchError::illegal(format!(
                "[date_histogram] time_zone [{text}] is not an offset like +01:00"
            ))
        };
        if !(digits.len() == 2 || digits.len() == 4) || !digits.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        let hours: i32 = digits[..2].parse().map_err(|_| bad())?;
        let minutes: i32 = if digits.len() == 4 {
            digits[2..].parse().map_err(|_| bad())?
        } else {
            0
        };
        if hours > 18 || minutes > 59 {
            return Err(bad());
        }
        let offset =
            Offset::from_seconds(sign * (hours * 3600 + minutes * 60)).map_err(|_| bad())?;
        return Ok(TimeZone::fixed(offset));
    }
    TimeZone::get(t).map_err(|e| {
        SearchError::illegal(format!("[date_histogram] unknown time_zone [{text}]: {e}"))
    })
}

/// Whether `zone` is UTC at every instant.
pub fn is_utc(zone: &TimeZone) -> bool {
    zone.to_fixed_offset().is_ok_and(|o| o.seconds() == 0)
}

/// The zone's offset from UTC at `ms` (epoch milliseconds), in milliseconds.
pub fn offset_ms(zone: &TimeZone, ms: i64) -> i64 {
    let at = Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH);
    i64::from(zone.to_offset(at).seconds()) * 1000
}

/// An instant (epoch ms) as Elasticsearch writes a bucket key in a zone:
/// `2023-11-13T00:00:00.000+01:00` (`Z` for a zero offset).
pub fn format(zone: &TimeZone, ms: i64) -> Option<String> {
    let zoned = Timestamp::from_millisecond(ms).ok()?.to_zoned(zone.clone());
    let text = zoned.strftime("%Y-%m-%dT%H:%M:%S%.3f%:z").to_string();
    Some(match text.strip_suffix("+00:00") {
        Some(local) => format!("{local}Z"),
        None => text,
    })
}

/// What a bucket spans on the local calendar or clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A local day, midnight to midnight (23 or 25 hours across a DST change).
    Day,
    /// A local week from Monday.
    Week,
    /// A local month.
    Month,
    /// A local quarter (January, April, July, October).
    Quarter,
    /// A local year.
    Year,
    /// A fixed length (ms) on the local clock, counted from the local epoch.
    Fixed(i64),
}

impl Unit {
    /// The unit of a `calendar_interval` (`1d`, `day`, ...); seconds, minutes and hours are
    /// the same length everywhere, so fixed.
    pub fn calendar(s: &str) -> Option<Self> {
        Some(match s {
            "1s" | "second" => Self::Fixed(1000),
            "1m" | "minute" => Self::Fixed(60_000),
            "1h" | "hour" => Self::Fixed(3_600_000),
            "1d" | "day" => Self::Day,
            "1w" | "week" => Self::Week,
            "1M" | "month" => Self::Month,
            "1q" | "quarter" => Self::Quarter,
            "1y" | "year" => Self::Year,
            _ => return None,
        })
    }

    /// How the unit is written in a mapped aggregation's name (see [`Unit::from_tag`]).
    pub fn tag(self) -> String {
        match self {
            Self::Day => "d".into(),
            Self::Week => "w".into(),
            Self::Month => "M".into(),
            Self::Quarter => "q".into(),
            Self::Year => "y".into(),
            Self::Fixed(ms) => format!("f{ms}"),
        }
    }

    /// The unit [`Unit::tag`] wrote.
    pub fn from_tag(tag: &str) -> Option<Self> {
        Some(match tag {
            "d" => Self::Day,
            "w" => Self::Week,
            "M" => Self::Month,
            "q" => Self::Quarter,
            "y" => Self::Year,
            f => Self::Fixed(
                f.strip_prefix('f')?
                    .parse()
                    .ok()
                    .filter(|ms: &i64| *ms > 0)?,
            ),
        })
    }
}

/// A duration as Elasticsearch writes a histogram's `offset`: `-1h`, `+30m`, `4d`, `500ms`.
pub fn duration_ms(text: &str) -> Option<i64> {
    let t = text.trim();
    let (sign, rest) = match t.strip_prefix('-') {
        Some(r) => (-1, r),
        None => (1, t.strip_prefix('+').unwrap_or(t)),
    };
    let split = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = rest.split_at(split);
    let n: i64 = number.parse().ok()?;
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(unit_ms).map(|ms| sign * ms)
}

/// Rounding of instants to the start of their local [`Unit`] in a zone, shifted by an
/// `offset` as Elasticsearch's histogram offset shifts bucket starts.
#[derive(Debug, Clone)]
pub struct Rounding {
    /// The unit.
    pub unit: Unit,
    /// The zone.
    pub zone: TimeZone,
    /// Added to every bucket start (ms).
    pub offset_ms: i64,
}

/// A local date and time as the milliseconds a UTC clock showing it would count.
fn wall_ms(dt: DateTime) -> Option<i64> {
    Some(TimeZone::UTC.to_timestamp(dt).ok()?.as_millisecond())
}

fn from_wall_ms(ms: i64) -> Option<DateTime> {
    Some(TimeZone::UTC.to_datetime(Timestamp::from_millisecond(ms).ok()?))
}

impl Rounding {
    /// The local date and time of `ms` (offset removed).
    fn local(&self, ms: i64) -> Option<DateTime> {
        let ts = Timestamp::from_millisecond(ms.checked_sub(self.offset_ms)?).ok()?;
        Some(self.zone.to_datetime(ts))
    }

    /// The instant (epoch ms, offset added) of a local date and time; a time that a DST change
    /// skips or repeats is taken as Java's (and so Elasticsearch's) would: the later side of a
    /// gap, the earlier of an overlap.
    fn instant(&self, local: DateTime) -> Option<i64> {
        let ts = self.zone.to_ambiguous_timestamp(local).compatible().ok()?;
        ts.as_millisecond().checked_add(self.offset_ms)
    }

    fn unit_start(&self, local: DateTime) -> Option<DateTime> {
        let date = local.date();
        let day = |d: Date| DateTime::from_parts(d, Time::midnight());
        Some(match self.unit {
            Unit::Fixed(len) => from_wall_ms(wall_ms(local)?.div_euclid(len) * len)?,
            Unit::Day => day(date),
            Unit::Week => {
                let back = i64::from(date.weekday().to_monday_zero_offset());
                day(date.checked_sub(back.days()).ok()?)
            }
            Unit::Month => day(date.first_of_month()),
            Unit::Quarter => day(Date::new(date.year(), (date.month() - 1) / 3 * 3 + 1, 1).ok()?),
            Unit::Year => day(Date::new(date.year(), 1, 1).ok()?),
        })
    }

    /// The start (epoch ms) of the local unit holding `ms`.
    pub fn start(&self, ms: i64) -> Option<i64> {
        let start = self.unit_start(self.local(ms)?)?;
        self.instant(start)
    }

    /// The start of the unit after the one starting at `start`.
    pub fn next(&self, start: i64) -> Option<i64> {
        let local = self.local(start)?;
        let next = match self.unit {
            Unit::Fixed(len) => from_wall_ms(wall_ms(local)?.checked_add(len)?)?,
            Unit::Day => local.checked_add(1.day()).ok()?,
            Unit::Week => local.checked_add(7.days()).ok()?,
            Unit::Month => local.checked_add(1.month()).ok()?,
            Unit::Quarter => local.checked_add(3.months()).ok()?,
            Unit::Year => local.checked_add(1.year()).ok()?,
        };
        // Rounded again: a unit whose local start a DST change skipped starts later.
        let at = self.instant(self.unit_start(next)?)?;
        (at > start).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paris() -> TimeZone {
        parse("Europe/Paris").unwrap()
    }

    #[test]
    fn zones_are_read_as_iana_names_offsets_or_utc() {
        assert!(is_utc(&parse("UTC").unwrap()));
        assert!(is_utc(&parse("+00:00").unwrap()));
        assert_eq!(offset_ms(&parse("+01:00").unwrap(), 0), 3_600_000);
        assert_eq!(offset_ms(&parse("-0530").unwrap(), 0), -19_800_000);
        assert_eq!(offset_ms(&parse("+02").unwrap(), 0), 7_200_000);
        // Paris: +01:00 in November, +02:00 in July.
        assert_eq!(offset_ms(&paris(), 1_699_833_600_000), 3_600_000);
        assert_eq!(offset_ms(&paris(), 1_689_000_000_000), 7_200_000);
        assert!(parse("Mars/Olympus").is_err());
        assert!(parse("+1:0").is_err());
    }

    #[test]
    fn local_days_start_at_local_midnight_and_last_23_hours_across_the_spring_change() {
        let day = Rounding {
            unit: Unit::Day,
            zone: paris(),
            offset_ms: 0,
        };
        // 2023-11-13T05:00Z is 06:00 in Paris; its day began at 2023-11-12T23:00Z.
        assert_eq!(day.start(1_699_851_600_000), Some(1_699_830_000_000));
        // 2023-03-26 (clocks go forward at 02:00) lasts 23 hours.
        let start = day.start(1_679_832_000_000).unwrap(); // 2023-03-26T12:00Z
        assert_eq!(start, 1_679_785_200_000); // 2023-03-25T23:00Z
        assert_eq!(day.next(start), Some(start + 23 * 3_600_000));
        assert_eq!(
            format(&paris(), start).as_deref(),
            Some("2023-03-26T00:00:00.000+01:00")
        );
        assert_eq!(
            format(&TimeZone::UTC, start).as_deref(),
            Some("2023-03-25T23:00:00.000Z")
        );
    }

    #[test]
    fn weeks_months_quarters_and_years_start_on_their_local_first_day() {
        let at = 1_699_851_600_000; // 2023-11-13T05:00Z, a Monday
        let r = |unit| Rounding {
            unit,
            zone: paris(),
            offset_ms: 0,
        };
        assert_eq!(r(Unit::Week).start(at), Some(1_699_830_000_000));
        assert_eq!(r(Unit::Month).start(at), Some(1_698_793_200_000)); // 2023-10-31T23:00Z
        assert_eq!(r(Unit::Quarter).start(at), Some(1_696_111_200_000)); // 2023-09-30T22:00Z
        assert_eq!(r(Unit::Year).start(at), Some(1_672_527_600_000)); // 2022-12-31T23:00Z
        let fixed = Rounding {
            unit: Unit::Fixed(12 * 3_600_000),
            zone: paris(),
            offset_ms: 0,
        };
        assert_eq!(fixed.start(at), Some(1_699_830_000_000));
        assert_eq!(
            Unit::from_tag(&Unit::Fixed(60_000).tag()),
            Some(Unit::Fixed(60_000))
        );
        assert_eq!(duration_ms("-1h"), Some(-3_600_000));
        assert_eq!(duration_ms("4d"), Some(345_600_000));
    }
}
