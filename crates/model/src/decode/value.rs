//! Typed values from raw JSON text, exactly: decimals never pass through `f64`, timestamps keep
//! their microseconds, integers are range-checked.

use std::borrow::Cow;

use chrono::{DateTime, NaiveDate};

use super::RejectKind;
use crate::spec::ColumnType;

/// One decoded value, ready to append to a column.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell<'a> {
    /// No value (JSON `null` or absent).
    Null,
    /// A string.
    Str(Cow<'a, str>),
    /// An `int`.
    Int(i32),
    /// A `long`.
    Long(i64),
    /// A `float`.
    Float(f32),
    /// A `double`.
    Double(f64),
    /// A `boolean`.
    Bool(bool),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since the epoch, UTC.
    Timestamp(i64),
    /// Unscaled value at the column's scale.
    Decimal(i128),
}

/// Earliest timestamp every reader represents: 0001-01-01T00:00:00Z, in microseconds.
pub const MIN_TIMESTAMP_US: i64 = -62_135_596_800_000_000;
/// Latest timestamp every reader represents: 9999-12-31T23:59:59.999999Z, in microseconds.
pub const MAX_TIMESTAMP_US: i64 = 253_402_300_799_999_999;
/// Earliest date every reader represents: 0001-01-01, in days since 1970-01-01.
pub const MIN_DATE_DAYS: i32 = -719_162;
/// Latest date every reader represents: 9999-12-31, in days since 1970-01-01.
pub const MAX_DATE_DAYS: i32 = 2_932_896;
/// The range, as messages name it.
pub const TIME_RANGE: &str = "years 0001 to 9999 (what Athena, Spark and Python readers all hold)";

/// Refuses a timestamp outside [`MIN_TIMESTAMP_US`]..=[`MAX_TIMESTAMP_US`]: a value readers cannot
/// represent would break every read of the table, not only this row.
pub fn timestamp_in_range(us: i64, shown: impl std::fmt::Display) -> Result<i64, ValueError> {
    if (MIN_TIMESTAMP_US..=MAX_TIMESTAMP_US).contains(&us) {
        Ok(us)
    } else {
        Err(ValueError::new(
            RejectKind::OutOfRange,
            format!("timestamp {shown} is outside {TIME_RANGE}"),
        ))
    }
}

/// Why a value was refused: the dead-letter kind and a short detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    /// The dead-letter kind.
    pub kind: RejectKind,
    /// What is wrong with the value.
    pub detail: String,
}

impl ValueError {
    pub(crate) fn new(kind: RejectKind, detail: impl Into<String>) -> Self {
        ValueError {
            kind,
            detail: detail.into(),
        }
    }
}

/// What kind of JSON value a raw text holds, for messages.
pub fn json_kind(raw: &str) -> &'static str {
    match raw.as_bytes().first() {
        Some(b'"') => "a string",
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// Decodes the raw JSON text of one value as `ty`. `null` becomes [`Cell::Null`].
pub fn parse_cell(ty: ColumnType, raw: &str) -> Result<Cell<'_>, ValueError> {
    let first = raw.as_bytes().first().copied().unwrap_or(b'n');
    if first == b'n' {
        return Ok(Cell::Null);
    }
    let wrong = || {
        ValueError::new(
            RejectKind::WrongType,
            format!("expected {}, found {}", expected(ty), json_kind(raw)),
        )
    };
    let is_number = first == b'-' || first.is_ascii_digit();
    match ty {
        ColumnType::String if first == b'"' => Ok(Cell::Str(json_string(raw)?)),
        ColumnType::Boolean if first == b't' => Ok(Cell::Bool(true)),
        ColumnType::Boolean if first == b'f' => Ok(Cell::Bool(false)),
        ColumnType::Int if is_number => {
            let v = parse_integer(raw, ty)?;
            i32::try_from(v).map(Cell::Int).map_err(|_| {
                ValueError::new(RejectKind::OutOfRange, format!("{raw} does not fit an int"))
            })
        }
        ColumnType::Long if is_number => parse_integer(raw, ty).map(Cell::Long),
        ColumnType::Double if is_number => {
            let v: f64 = raw.parse().map_err(|_| wrong())?;
            finite(v, raw).map(Cell::Double)
        }
        ColumnType::Float if is_number => {
            let v: f32 = raw.parse().map_err(|_| wrong())?;
            finite(v as f64, raw).map(|_| Cell::Float(v))
        }
        ColumnType::Decimal { precision, scale } if is_number => {
            parse_decimal(raw, precision, scale).map(Cell::Decimal)
        }
        ColumnType::Decimal { precision, scale } if first == b'"' => {
            let s = json_string(raw)?;
            parse_decimal(s.trim(), precision, scale).map(Cell::Decimal)
        }
        ColumnType::Timestamp if first == b'"' => {
            parse_timestamp(&json_string(raw)?).map(Cell::Timestamp)
        }
        ColumnType::Timestamp if is_number => {
            let ms = parse_integer(raw, ty)
                .map_err(|e| ValueError::new(RejectKind::InvalidTimestamp, e.detail))?;
            let us = ms.checked_mul(1000).ok_or_else(|| {
                ValueError::new(
                    RejectKind::OutOfRange,
                    format!("epoch milliseconds {raw} is outside {TIME_RANGE}"),
                )
            })?;
            timestamp_in_range(us, format_args!("{raw} (epoch milliseconds)")).map(Cell::Timestamp)
        }
        ColumnType::Date if first == b'"' => {
            let s = json_string(raw)?;
            let d = NaiveDate::parse_from_str(&s, "%Y-%m-%d").map_err(|_| {
                ValueError::new(
                    RejectKind::InvalidTimestamp,
                    format!("{s:?} is not a date YYYY-MM-DD"),
                )
            })?;
            let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
            let days = (d - epoch).num_days();
            if (i64::from(MIN_DATE_DAYS)..=i64::from(MAX_DATE_DAYS)).contains(&days) {
                Ok(Cell::Date(days as i32))
            } else {
                Err(ValueError::new(
                    RejectKind::OutOfRange,
                    format!("date {s:?} is outside {TIME_RANGE}"),
                ))
            }
        }
        _ => Err(wrong()),
    }
}

fn expected(ty: ColumnType) -> String {
    match ty {
        ColumnType::Timestamp => "a timestamp (RFC 3339 string or epoch milliseconds)".into(),
        ColumnType::Decimal { .. } => format!("{ty} (number or numeric string)"),
        ColumnType::Date => "a date string YYYY-MM-DD".into(),
        _ => ty.to_string(),
    }
}

fn finite(v: f64, raw: &str) -> Result<f64, ValueError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ValueError::new(
            RejectKind::OutOfRange,
            format!("{raw} is out of range"),
        ))
    }
}

/// The content of a JSON string literal, borrowed unless it has escapes.
fn json_string(raw: &str) -> Result<Cow<'_, str>, ValueError> {
    let inner = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .ok_or_else(|| ValueError::new(RejectKind::NotJson, "malformed string"))?;
    if !inner.contains('\\') {
        return Ok(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(raw)
        .map(Cow::Owned)
        .map_err(|e| ValueError::new(RejectKind::NotJson, e.to_string()))
}

/// A JSON integer literal (no fraction, no exponent).
fn parse_integer(raw: &str, ty: ColumnType) -> Result<i64, ValueError> {
    if raw.contains(['.', 'e', 'E']) {
        return Err(ValueError::new(
            RejectKind::WrongType,
            format!(
                "expected {}, found the non-integer number {raw}",
                expected(ty)
            ),
        ));
    }
    raw.parse::<i64>()
        .map_err(|_| ValueError::new(RejectKind::OutOfRange, format!("{raw} does not fit a {ty}")))
}

/// RFC 3339 with `Z` or an offset, to UTC microseconds.
pub fn parse_timestamp(s: &str) -> Result<i64, ValueError> {
    let t = DateTime::parse_from_rfc3339(s.trim()).map_err(|e| {
        ValueError::new(
            RejectKind::InvalidTimestamp,
            format!("{s:?} is not an RFC 3339 timestamp with Z or an offset ({e})"),
        )
    })?;
    timestamp_in_range(t.timestamp_micros(), format_args!("{s:?}"))
}

/// Parses a decimal literal exactly into its unscaled value at `scale`.
///
/// Accepts an optional sign, digits with an optional fraction and an optional exponent. Refuses
/// more fractional digits than `scale` (unless they are zeros) and more than `precision` digits.
pub fn parse_decimal(text: &str, precision: u8, scale: u8) -> Result<i128, ValueError> {
    let bad = || {
        ValueError::new(
            RejectKind::WrongType,
            format!("{text:?} is not a decimal number"),
        )
    };
    let bytes = text.as_bytes();
    let (negative, mut i) = match bytes.first() {
        Some(b'-') => (true, 1),
        Some(b'+') => (false, 1),
        _ => (false, 0),
    };
    let mut digits: Vec<u8> = Vec::with_capacity(bytes.len());
    let mut frac_digits: i64 = 0;
    let mut seen_point = false;
    let mut any_digit = false;
    while i < bytes.len() {
        match bytes[i] {
            c @ b'0'..=b'9' => {
                any_digit = true;
                digits.push(c - b'0');
                if seen_point {
                    frac_digits += 1;
                }
            }
            b'.' if !seen_point => seen_point = true,
            b'e' | b'E' => break,
            _ => return Err(bad()),
        }
        i += 1;
    }
    if !any_digit {
        return Err(bad());
    }
    let mut exponent: i64 = 0;
    if i < bytes.len() {
        let exp_text = &text[i + 1..];
        exponent = exp_text.parse::<i64>().map_err(|_| bad())?;
        if exponent.abs() > 1000 {
            return Err(ValueError::new(
                RejectKind::OutOfRange,
                format!("{text} is out of range"),
            ));
        }
    }
    // unscaled = digits * 10^(exponent - frac_digits + scale)
    let mut shift = exponent - frac_digits + scale as i64;
    while shift < 0 {
        match digits.pop() {
            Some(0) => shift += 1,
            Some(_) => {
                return Err(ValueError::new(
                    RejectKind::OutOfRange,
                    format!("{text} has more than {scale} decimal places"),
                ));
            }
            None => {
                shift = 0;
            }
        }
    }
    let first_nonzero = digits.iter().position(|&d| d != 0).unwrap_or(digits.len());
    let significant = &digits[first_nonzero..];
    let out_of_range = || {
        ValueError::new(
            RejectKind::OutOfRange,
            format!("{text} does not fit decimal({precision},{scale})"),
        )
    };
    if significant.is_empty() {
        return Ok(0);
    }
    if significant.len() as i64 + shift > precision as i64 {
        return Err(out_of_range());
    }
    let mut v: i128 = 0;
    for &d in significant {
        v = v * 10 + d as i128;
    }
    for _ in 0..shift {
        v *= 10;
    }
    Ok(if negative { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D18_2: ColumnType = ColumnType::Decimal {
        precision: 18,
        scale: 2,
    };

    #[test]
    fn decimals_are_exact_from_numbers_and_strings() {
        assert_eq!(parse_cell(D18_2, "12.34"), Ok(Cell::Decimal(1234)));
        assert_eq!(parse_cell(D18_2, "\"12.34\""), Ok(Cell::Decimal(1234)));
        assert_eq!(parse_cell(D18_2, "-0.1"), Ok(Cell::Decimal(-10)));
        assert_eq!(parse_cell(D18_2, "7"), Ok(Cell::Decimal(700)));
        assert_eq!(parse_cell(D18_2, "1.5e2"), Ok(Cell::Decimal(15000)));
        assert_eq!(parse_cell(D18_2, "12.340"), Ok(Cell::Decimal(1234)));
        assert_eq!(parse_cell(D18_2, "1234E-2"), Ok(Cell::Decimal(1234)));
        // 0.1 + 0.2 style values that f64 would distort
        assert_eq!(
            parse_cell(D18_2, "9999999999999999.99"),
            Ok(Cell::Decimal(999_999_999_999_999_999))
        );
        assert_eq!(
            parse_decimal("12345678901234567890123456789012345678", 38, 0),
            Ok(12345678901234567890123456789012345678)
        );
    }

    #[test]
    fn decimals_refuse_lost_digits_and_overflow() {
        let err = parse_cell(D18_2, "1.234").expect_err("three places");
        assert_eq!(err.kind, RejectKind::OutOfRange);
        let err = parse_cell(D18_2, "10000000000000000").expect_err("17 integer digits");
        assert_eq!(err.kind, RejectKind::OutOfRange);
        let err = parse_cell(D18_2, "\"12,50\"").expect_err("comma");
        assert_eq!(err.kind, RejectKind::WrongType);
        let err = parse_cell(D18_2, "true").expect_err("bool");
        assert_eq!(err.kind, RejectKind::WrongType);
        assert!(parse_decimal("1e1000", 38, 0).is_err());
        assert!(parse_decimal("123456789012345678901234567890123456789", 38, 0).is_err());
    }

    #[test]
    fn timestamps_accept_rfc3339_with_offsets_and_epoch_millis() {
        let ts = |s| parse_cell(ColumnType::Timestamp, s);
        assert_eq!(
            ts("\"2026-11-29T10:00:00Z\""),
            Ok(Cell::Timestamp(1_795_946_400_000_000))
        );
        assert_eq!(
            ts("\"2026-11-29T11:00:00+01:00\""),
            Ok(Cell::Timestamp(1_795_946_400_000_000))
        );
        assert_eq!(
            ts("\"2026-11-29T10:00:00.123456Z\""),
            Ok(Cell::Timestamp(1_795_946_400_123_456))
        );
        assert_eq!(
            ts("1795946400123"),
            Ok(Cell::Timestamp(1_795_946_400_123_000))
        );
        assert_eq!(
            ts("\"2026-11-29T10:00:00\"").map_err(|e| e.kind),
            Err(RejectKind::InvalidTimestamp)
        );
        assert_eq!(
            ts("\"yesterday\"").map_err(|e| e.kind),
            Err(RejectKind::InvalidTimestamp)
        );
        assert_eq!(
            ts("1.5").map_err(|e| e.kind),
            Err(RejectKind::InvalidTimestamp)
        );
        assert_eq!(ts("false").map_err(|e| e.kind), Err(RejectKind::WrongType));
    }

    #[test]
    fn timestamps_and_dates_outside_years_1_to_9999_are_out_of_range() {
        let kind = |ty, raw| parse_cell(ty, raw).map_err(|e| e.kind);
        // The poison pill: epoch milliseconds that fit an i64 in microseconds but lie in the
        // year 265,000 (made iceberg's day transform panic while naming the partition).
        assert_eq!(
            kind(ColumnType::Timestamp, "8300000000000000"),
            Err(RejectKind::OutOfRange)
        );
        assert_eq!(
            kind(ColumnType::Timestamp, "-8300000000000000"),
            Err(RejectKind::OutOfRange)
        );
        assert_eq!(
            kind(ColumnType::Timestamp, "9223372036854775807"),
            Err(RejectKind::OutOfRange)
        );
        assert_eq!(
            kind(ColumnType::Timestamp, "\"0000-12-31T23:59:59Z\""),
            Err(RejectKind::OutOfRange)
        );
        assert_eq!(
            kind(ColumnType::Timestamp, "\"0001-01-01T00:30:00+01:00\""),
            Err(RejectKind::OutOfRange)
        );
        assert_eq!(
            kind(ColumnType::Date, "\"+200000-01-01\""),
            Err(RejectKind::OutOfRange)
        );
        assert_eq!(
            kind(ColumnType::Date, "\"0000-06-01\""),
            Err(RejectKind::OutOfRange)
        );
        let err = parse_cell(ColumnType::Timestamp, "8300000000000000").expect_err("out");
        assert!(err.detail.contains("years 0001 to 9999"), "{}", err.detail);
        // The edges are in.
        assert_eq!(
            kind(ColumnType::Timestamp, "\"0001-01-01T00:00:00Z\""),
            Ok(Cell::Timestamp(MIN_TIMESTAMP_US))
        );
        assert_eq!(
            kind(ColumnType::Timestamp, "\"9999-12-31T23:59:59.999999Z\""),
            Ok(Cell::Timestamp(MAX_TIMESTAMP_US))
        );
        assert_eq!(
            kind(ColumnType::Timestamp, "253402300799999"),
            Ok(Cell::Timestamp(253_402_300_799_999_000))
        );
        assert_eq!(
            kind(ColumnType::Date, "\"0001-01-01\""),
            Ok(Cell::Date(MIN_DATE_DAYS))
        );
        assert_eq!(
            kind(ColumnType::Date, "\"9999-12-31\""),
            Ok(Cell::Date(MAX_DATE_DAYS))
        );
    }

    #[test]
    fn integers_floats_strings_and_dates() {
        assert_eq!(parse_cell(ColumnType::Int, "42"), Ok(Cell::Int(42)));
        assert_eq!(
            parse_cell(ColumnType::Int, "4294967296").map_err(|e| e.kind),
            Err(RejectKind::OutOfRange)
        );
        assert_eq!(
            parse_cell(ColumnType::Long, "4.2").map_err(|e| e.kind),
            Err(RejectKind::WrongType)
        );
        assert_eq!(
            parse_cell(ColumnType::Long, "\"42\"").map_err(|e| e.kind),
            Err(RejectKind::WrongType)
        );
        assert_eq!(
            parse_cell(ColumnType::Double, "21.5"),
            Ok(Cell::Double(21.5))
        );
        assert_eq!(
            parse_cell(ColumnType::Double, "1e400").map_err(|e| e.kind),
            Err(RejectKind::OutOfRange)
        );
        assert_eq!(
            parse_cell(ColumnType::String, "\"plain\""),
            Ok(Cell::Str(Cow::Borrowed("plain")))
        );
        assert_eq!(
            parse_cell(ColumnType::String, r#""a\"b\u00e9""#),
            Ok(Cell::Str(Cow::Owned("a\"bé".into())))
        );
        assert_eq!(
            parse_cell(ColumnType::String, "12").map_err(|e| e.kind),
            Err(RejectKind::WrongType)
        );
        assert_eq!(parse_cell(ColumnType::String, "null"), Ok(Cell::Null));
        assert_eq!(
            parse_cell(ColumnType::Date, "\"1970-01-02\""),
            Ok(Cell::Date(1))
        );
        assert_eq!(
            parse_cell(ColumnType::Boolean, "false"),
            Ok(Cell::Bool(false))
        );
    }
}
