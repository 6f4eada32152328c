//! Event time in the spec: a table's watermark (`watermark = "created_at - INTERVAL '30'
//! SECOND"`), durations (`INTERVAL '5' MINUTE` or `5 minutes`), and dedup settings.

use super::{ColumnSpec, ColumnType};

/// A table's event time: the column, and the watermark it yields per Kafka partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTime {
    /// The timestamp column that carries event time.
    pub column: String,
    /// How far out of order records may arrive: watermark = highest event time seen − this, ms.
    pub out_of_orderness_ms: i64,
    /// A partition that received nothing for this long no longer holds windows back: the
    /// scheduled stage moves its watermark up to the lowest of the partitions still receiving
    /// (`idle_timeout`), ms.
    pub idle_timeout_ms: i64,
    /// A record whose event time is more than this ahead of its Kafka timestamp is not
    /// believed: it does not move the partition's watermark, and the stateful tables take it as
    /// a dead letter of kind `future` (`max_event_time_ahead`), ms.
    pub max_ahead_ms: i64,
}

/// Default `idle_timeout`: 5 minutes.
pub const DEFAULT_IDLE_TIMEOUT_MS: i64 = 300_000;
/// Default `max_event_time_ahead`: a day.
pub const DEFAULT_MAX_AHEAD_MS: i64 = 86_400_000;

/// Duplicates dropped by key within a time bound: the first occurrence wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dedup {
    /// The columns of the source that identify an event.
    pub key: Vec<String>,
    /// A copy whose event time is within this of the first occurrence's is dropped, ms.
    pub within_ms: i64,
}

const DURATION_HELP: &str = "write a duration as INTERVAL '30' SECOND or 30 seconds (units: millisecond, second, minute, hour, day)";

/// Milliseconds of `INTERVAL 'n' UNIT` or `n unit` (units millisecond … day, singular or
/// plural, any case).
pub fn parse_duration_ms(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let (number, unit) = if let Some(rest) = lower.strip_prefix("interval") {
        let rest = rest.trim_start();
        let quoted = rest
            .strip_prefix('\'')
            .and_then(|r| r.split_once('\''))
            .ok_or_else(|| format!("cannot read duration {t:?}; {DURATION_HELP}"))?;
        let (inner, unit) = (quoted.0.trim(), quoted.1.trim());
        // INTERVAL '5 minutes' carries its unit inside the quotes.
        match inner.split_once(char::is_whitespace) {
            Some((n, u)) if unit.is_empty() => (n.to_string(), u.trim().to_string()),
            _ => (inner.to_string(), unit.to_string()),
        }
    } else {
        let (n, u) = lower
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("cannot read duration {t:?}; {DURATION_HELP}"))?;
        (n.to_string(), u.trim().to_string())
    };
    let n: i64 = number
        .parse()
        .map_err(|_| format!("cannot read duration {t:?}; {DURATION_HELP}"))?;
    let per: i64 = match unit.as_str() {
        "ms" | "millisecond" | "milliseconds" => 1,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000,
        "min" | "mins" | "minute" | "minutes" => 60_000,
        "h" | "hour" | "hours" => 3_600_000,
        "day" | "days" => 86_400_000,
        _ => return Err(format!("unknown unit {unit:?} in {t:?}; {DURATION_HELP}")),
    };
    if n < 0 {
        return Err(format!("duration {t:?} is negative; use 0 or more"));
    }
    n.checked_mul(per)
        .filter(|ms| *ms <= 366 * 86_400_000)
        .ok_or_else(|| format!("duration {t:?} is longer than a year; use a shorter one"))
}

/// The event time of a table from `watermark = "<column> [- INTERVAL …]"`.
pub(super) fn parse_watermark(text: &str, columns: &[ColumnSpec]) -> Result<EventTime, String> {
    let (column, delay) = match text.split_once('-') {
        Some((c, d)) => (c.trim(), parse_duration_ms(d)?),
        None => (text.trim(), 0),
    };
    let col = columns.iter().find(|c| c.name == column).ok_or_else(|| {
        format!(
            "watermark column {column:?} is not a column of the table; write watermark = \"<timestamp column> - INTERVAL '30' SECOND\""
        )
    })?;
    if col.column_type != ColumnType::Timestamp {
        return Err(format!(
            "watermark column {column:?} is of type {}; event time must be a timestamp column",
            col.column_type
        ));
    }
    Ok(EventTime {
        idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
        max_ahead_ms: DEFAULT_MAX_AHEAD_MS,
        column: column.to_string(),
        out_of_orderness_ms: delay,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_both_spellings() {
        assert_eq!(parse_duration_ms("INTERVAL '30' SECOND"), Ok(30_000));
        assert_eq!(parse_duration_ms("interval '5' minutes"), Ok(300_000));
        assert_eq!(parse_duration_ms("INTERVAL '1 hour'"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("2 days"), Ok(172_800_000));
        assert_eq!(parse_duration_ms("250 ms"), Ok(250));
        assert_eq!(parse_duration_ms("10 milliseconds"), Ok(10));
        assert!(
            parse_duration_ms("soon")
                .unwrap_err()
                .contains("INTERVAL '30' SECOND")
        );
        assert!(
            parse_duration_ms("5 fortnights")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_duration_ms("400 days").unwrap_err().contains("year"));
        assert!(parse_duration_ms("INTERVAL '-1' SECOND").is_err());
    }
}
