//! Partition paths: the `name=value/…` directories data files are written under.
//!
//! A path is only a name (Iceberg reads partition values from the manifests, never from paths),
//! but it becomes an object key, so it must be safe whatever the value: names and values are
//! escaped as Iceberg's Java implementation escapes them (`URLEncoder`: letters, digits and
//! `.-*_` kept, a space as `+`, every other byte as `%XX`), so `/`, `..` or control characters
//! in a string value cannot reach outside the table's directory. A value whose escaped form is
//! longer than [`MAX_VALUE_CHARS`] is cut and suffixed with a hash of the whole value, so keys
//! stay under S3's 1,024-byte limit and distinct values keep distinct directories.
//!
//! Dates and times are rendered here rather than by the Iceberg library, whose renderer panics
//! on values outside chrono's range (possible in tables other engines wrote).
//!
//! Grouping by partition (compaction) uses the partition tuple itself, never the path: a null
//! and the string `"null"` share a path, as in Java, but not a partition.

use chrono::{DateTime, Datelike, NaiveDate, Timelike};
use iceberg::spec::{
    Literal, PartitionSpec, PrimitiveLiteral, PrimitiveType, Struct, StructType, Transform, Type,
};

/// Longest escaped value kept whole in a path.
pub const MAX_VALUE_CHARS: usize = 100;

/// The path of a partition tuple under `spec` (empty for an unpartitioned spec).
pub fn partition_path(spec: &PartitionSpec, partition_type: &StructType, data: &Struct) -> String {
    let types = partition_type.fields();
    spec.fields()
        .iter()
        .enumerate()
        .map(|(i, field)| {
            let value = data.fields().get(i).and_then(Option::as_ref);
            let ty = types.get(i).map(|f| f.field_type.as_ref());
            let human = human_string(field.transform, ty, value);
            format!(
                "{}={}",
                escape(&field.name),
                shorten(escape(&human), &human)
            )
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Escapes like Java's `URLEncoder.encode(s, UTF_8)`.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'*' | b'_' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A topic as it appears in object names (ingest's files, spilled file lists): escaped like a
/// partition value, and cut and hashed past [`MAX_VALUE_CHARS`] (topics may be 249 characters,
/// file names only 255 bytes).
pub fn topic_in_name(topic: &str) -> String {
    shorten(escape(topic), topic)
}

/// The topic an object name carries, when it was not shortened (`None` if it was).
pub fn topic_from_name(name: &str) -> Option<String> {
    if name.len() == MAX_VALUE_CHARS && name.as_bytes().get(MAX_VALUE_CHARS - 17) == Some(&b'-') {
        return None;
    }
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = name.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn shorten(escaped: String, whole: &str) -> String {
    if escaped.len() <= MAX_VALUE_CHARS {
        return escaped;
    }
    // The escaped text is ASCII, so any byte index is a character boundary.
    let hash = xxhash_rust::xxh3::xxh3_64(whole.as_bytes());
    format!("{}-{hash:016x}", &escaped[..MAX_VALUE_CHARS - 17])
}

/// The value as Iceberg's `Transform.toHumanString` writes it.
fn human_string(transform: Transform, ty: Option<&Type>, value: Option<&Literal>) -> String {
    let Some(Literal::Primitive(lit)) = value else {
        return "null".into();
    };
    let prim = match ty {
        Some(Type::Primitive(p)) => p,
        _ => return "null".into(),
    };
    let text = match (transform, prim, lit) {
        (Transform::Void, _, _) => Some("null".into()),
        (Transform::Year, _, PrimitiveLiteral::Int(y)) => {
            Some(format!("{:04}", 1970 + i64::from(*y)))
        }
        (Transform::Month, _, PrimitiveLiteral::Int(m)) => {
            let m = i64::from(*m);
            Some(format!(
                "{:04}-{:02}",
                1970 + m.div_euclid(12),
                m.rem_euclid(12) + 1
            ))
        }
        (Transform::Hour, _, PrimitiveLiteral::Int(h)) => hours(i64::from(*h)),
        (_, PrimitiveType::Date, PrimitiveLiteral::Int(d)) => date(i64::from(*d)),
        (_, PrimitiveType::Timestamp | PrimitiveType::Timestamptz, PrimitiveLiteral::Long(us)) => {
            DateTime::from_timestamp_micros(*us)
                .map(|t| t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.6f").to_string())
        }
        (_, PrimitiveType::Decimal { scale, .. }, PrimitiveLiteral::Int128(v)) => {
            Some(decimal(*v, *scale))
        }
        (_, PrimitiveType::Uuid, PrimitiveLiteral::UInt128(v)) => {
            Some(uuid::Uuid::from_u128(*v).to_string())
        }
        (_, _, PrimitiveLiteral::String(s)) => Some(s.clone()),
        (_, _, PrimitiveLiteral::Boolean(b)) => Some(b.to_string()),
        (_, _, PrimitiveLiteral::Int(v)) => Some(v.to_string()),
        (_, _, PrimitiveLiteral::Long(v)) => Some(v.to_string()),
        (_, _, PrimitiveLiteral::Float(v)) => Some(v.to_string()),
        (_, _, PrimitiveLiteral::Double(v)) => Some(v.to_string()),
        (_, _, PrimitiveLiteral::Binary(b)) => {
            use base64::Engine;
            Some(base64::engine::general_purpose::STANDARD.encode(b))
        }
        _ => None,
    };
    // A value no calendar holds keeps its raw number: a name, never a panic.
    text.unwrap_or_else(|| match lit {
        PrimitiveLiteral::Int(v) => v.to_string(),
        PrimitiveLiteral::Long(v) => v.to_string(),
        other => format!("{other:?}"),
    })
}

/// An unscaled decimal at `scale`, as Java's `BigDecimal.toString` writes it (plain notation).
fn decimal(unscaled: i128, scale: u32) -> String {
    let digits = unscaled.unsigned_abs().to_string();
    let sign = if unscaled < 0 { "-" } else { "" };
    let scale = scale as usize;
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

fn date(days: i64) -> Option<String> {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
    let d = epoch.checked_add_signed(chrono::TimeDelta::try_days(days)?)?;
    Some(format!("{:04}-{:02}-{:02}", d.year(), d.month(), d.day()))
}

fn hours(h: i64) -> Option<String> {
    let t = DateTime::from_timestamp(h.checked_mul(3600)?, 0)?.naive_utc();
    Some(format!(
        "{:04}-{:02}-{:02}-{:02}",
        t.year(),
        t.month(),
        t.day(),
        t.hour()
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use iceberg::spec::{NestedField, Schema};

    use super::*;

    fn spec(transform: Transform, ty: PrimitiveType) -> (PartitionSpec, StructType) {
        let schema = Arc::new(
            Schema::builder()
                .with_fields(vec![Arc::new(NestedField::optional(
                    1,
                    "c",
                    Type::Primitive(ty),
                ))])
                .build()
                .expect("schema"),
        );
        let spec = PartitionSpec::builder(schema.clone())
            .add_partition_field("c", "c_part", transform)
            .expect("field")
            .build()
            .expect("spec");
        let ty = spec.partition_type(&schema).expect("type");
        (spec, ty)
    }

    fn path(transform: Transform, ty: PrimitiveType, v: Option<PrimitiveLiteral>) -> String {
        let (spec, st) = spec(transform, ty);
        partition_path(&spec, &st, &Struct::from_iter([v.map(Literal::Primitive)]))
    }

    #[test]
    fn string_values_cannot_leave_their_directory() {
        let p = path(
            Transform::Identity,
            PrimitiveType::String,
            Some(PrimitiveLiteral::String("../../etc/x y".into())),
        );
        assert_eq!(p, "c_part=..%2F..%2Fetc%2Fx+y");
        assert!(!p.contains('/'));
        let p = path(
            Transform::Identity,
            PrimitiveType::String,
            Some(PrimitiveLiteral::String("é\u{0}".into())),
        );
        assert_eq!(p, "c_part=%C3%A9%00");
    }

    #[test]
    fn topics_in_object_names_are_escaped_short_and_readable_back() {
        assert_eq!(topic_in_name("orders"), "orders");
        assert_eq!(topic_in_name("../x/y"), "..%2Fx%2Fy");
        assert_eq!(topic_from_name("..%2Fx%2Fy").as_deref(), Some("../x/y"));
        assert_eq!(
            topic_from_name("orders.v2-eu").as_deref(),
            Some("orders.v2-eu")
        );
        let long = "t".repeat(249);
        let name = topic_in_name(&long);
        assert_eq!(name.len(), MAX_VALUE_CHARS);
        assert_eq!(
            topic_from_name(&name),
            None,
            "a shortened topic is not guessed"
        );
    }

    #[test]
    fn long_values_are_cut_and_hashed_so_distinct_values_stay_apart() {
        let long = |c: char| {
            path(
                Transform::Identity,
                PrimitiveType::String,
                Some(PrimitiveLiteral::String(c.to_string().repeat(5000))),
            )
        };
        let (a, b) = (long('a'), long('b'));
        assert!(a.len() <= "c_part=".len() + MAX_VALUE_CHARS, "{}", a.len());
        assert_ne!(a, b);
        let a2 = path(
            Transform::Identity,
            PrimitiveType::String,
            Some(PrimitiveLiteral::String(format!("{}b", "a".repeat(4999)))),
        );
        assert_ne!(a, a2, "same prefix, different values");
    }

    #[test]
    fn dates_and_times_render_as_iceberg_does_and_never_panic() {
        assert_eq!(
            path(
                Transform::Day,
                PrimitiveType::Timestamp,
                Some(PrimitiveLiteral::Int(20_786))
            ),
            "c_part=2026-11-29"
        );
        assert_eq!(
            path(
                Transform::Hour,
                PrimitiveType::Timestamp,
                Some(PrimitiveLiteral::Int(498_874))
            ),
            "c_part=2026-11-29-10"
        );
        assert_eq!(
            path(
                Transform::Month,
                PrimitiveType::Date,
                Some(PrimitiveLiteral::Int(682))
            ),
            "c_part=2026-11"
        );
        assert_eq!(
            path(
                Transform::Year,
                PrimitiveType::Date,
                Some(PrimitiveLiteral::Int(56))
            ),
            "c_part=2026"
        );
        // Out of any calendar: the raw number, no panic.
        assert_eq!(
            path(
                Transform::Day,
                PrimitiveType::Timestamp,
                Some(PrimitiveLiteral::Int(i32::MAX))
            ),
            format!("c_part={}", i32::MAX)
        );
        assert_eq!(
            path(
                Transform::Day,
                PrimitiveType::Date,
                Some(PrimitiveLiteral::Int(i32::MIN))
            ),
            format!("c_part={}", i32::MIN)
        );
        assert_eq!(
            path(
                Transform::Identity,
                PrimitiveType::Timestamp,
                Some(PrimitiveLiteral::Long(i64::MAX))
            ),
            format!("c_part={}", i64::MAX)
        );
        assert_eq!(
            path(Transform::Identity, PrimitiveType::String, None),
            "c_part=null"
        );
        assert_eq!(
            path(
                Transform::Identity,
                PrimitiveType::Decimal {
                    precision: 9,
                    scale: 2
                },
                Some(PrimitiveLiteral::Int128(-5))
            ),
            "c_part=-0.05"
        );
        // A literal of another type than the column's (a foreign table): a name, no panic.
        assert_eq!(
            path(
                Transform::Identity,
                PrimitiveType::Date,
                Some(PrimitiveLiteral::String("x".into()))
            ),
            "c_part=x"
        );
    }
}
