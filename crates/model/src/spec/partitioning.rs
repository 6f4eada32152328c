//! `partition_by` in the spec: transforms parsed and checked against their source columns.

use toml::Spanned;

use super::load::is_identifier;
use super::{ColumnSpec, ColumnType, PartitionField};
use crate::error::{Error, Result};

const PARTITION_HELP: &str = "write identity(col), year(col), month(col), day(col), hour(col), bucket(N, col) or truncate(W, col)";

/// Parses `day(created_at)`, `bucket(16, id)`, `truncate(4, name)` or a bare column name.
pub(super) fn parse_partition(text: &str) -> Option<PartitionField> {
    use iceberg::spec::Transform;
    let t = text.trim();
    let Some((func, args)) = t.split_once('(') else {
        return is_identifier(t).then(|| PartitionField {
            transform: Transform::Identity,
            source: t.to_string(),
        });
    };
    let args: Vec<&str> = args.strip_suffix(')')?.split(',').map(str::trim).collect();
    let (transform, source) = match (func.trim(), args.as_slice()) {
        ("identity", [c]) => (Transform::Identity, *c),
        ("year", [c]) => (Transform::Year, *c),
        ("month", [c]) => (Transform::Month, *c),
        ("day", [c]) => (Transform::Day, *c),
        ("hour", [c]) => (Transform::Hour, *c),
        ("bucket", [n, c]) => (Transform::Bucket(n.parse().ok().filter(|n| *n > 0)?), *c),
        ("truncate", [w, c]) => (Transform::Truncate(w.parse().ok().filter(|w| *w > 0)?), *c),
        _ => return None,
    };
    is_identifier(source).then(|| PartitionField {
        transform,
        source: source.to_string(),
    })
}

/// The `partition_by` list of table `name`, checked against its columns.
pub(super) fn parse_partitioning(
    list: &[Spanned<String>],
    columns: &[ColumnSpec],
    name: &str,
    at: &impl Fn(std::ops::Range<usize>, String) -> Error,
) -> Result<Vec<PartitionField>> {
    let mut partition_by = Vec::new();
    for p in list {
        let field = parse_partition(p.get_ref()).ok_or_else(|| {
            at(
                p.span(),
                format!(
                    "cannot read partition transform {:?}; {PARTITION_HELP}",
                    p.get_ref()
                ),
            )
        })?;
        let col = columns.iter().find(|c| c.name == field.source).ok_or_else(|| {
            at(p.span(), format!(
                "partition source column {:?} is not a column of table {name:?}; partition by one of its columns",
                field.source
            ))
        })?;
        check_transform(&field, col.column_type).map_err(|m| at(p.span(), m))?;
        if partition_by
            .iter()
            .any(|f: &PartitionField| f.field_name() == field.field_name())
        {
            return Err(at(
                p.span(),
                format!("partition {:?} is listed twice", p.get_ref()),
            ));
        }
        partition_by.push(field);
    }
    Ok(partition_by)
}

fn check_transform(field: &PartitionField, ty: ColumnType) -> std::result::Result<(), String> {
    use iceberg::spec::Transform;
    let ok = match field.transform {
        Transform::Identity => !matches!(
            ty,
            ColumnType::Float | ColumnType::Double | ColumnType::Struct
        ),
        Transform::Year | Transform::Month | Transform::Day => {
            matches!(ty, ColumnType::Date | ColumnType::Timestamp)
        }
        Transform::Hour => ty == ColumnType::Timestamp,
        Transform::Bucket(_) => matches!(
            ty,
            ColumnType::Int
                | ColumnType::Long
                | ColumnType::Decimal { .. }
                | ColumnType::String
                | ColumnType::Date
                | ColumnType::Timestamp
        ),
        Transform::Truncate(_) => matches!(
            ty,
            ColumnType::Int | ColumnType::Long | ColumnType::Decimal { .. } | ColumnType::String
        ),
        Transform::Void | Transform::Unknown => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "transform {} cannot apply to column {:?} of type {ty}; day/month/year need a date or timestamp, hour a timestamp, truncate an int, long, decimal or string",
            field.transform, field.source
        ))
    }
}
