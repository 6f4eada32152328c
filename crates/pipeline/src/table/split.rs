//! Splitting a batch by partition value: the rows of each partition tuple, in batch order, with
//! the tuple as Iceberg's `Struct`.
//!
//! The partition transforms run on whole columns (Iceberg's `PartitionValueCalculator`); rows are
//! grouped by the transformed values in Arrow's row format (one byte string per row, hashed
//! once), and only one row per group is turned into an Iceberg literal. Iceberg's own
//! `RecordBatchPartitionSplitter` builds a `Struct` literal for every row and hashes those.

use std::collections::HashMap;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_row::{RowConverter, SortField};
use iceberg::arrow::{PartitionValueCalculator, arrow_struct_to_literal};
use iceberg::spec::{Literal, Struct};

use crate::error::{Error, Result};
use crate::schema::TableLayout;

/// The rows of `batch` (a batch of `layout`'s table) per partition tuple, groups in the order
/// of their first row, rows in batch order. An unpartitioned table gives one group.
pub(crate) fn split_by_partition(
    layout: &TableLayout,
    batch: &RecordBatch,
) -> Result<Vec<(Struct, RecordBatch)>> {
    if layout.partition_spec.is_unpartitioned() {
        return Ok(vec![(Struct::empty(), batch.clone())]);
    }
    let ctx = |what: &str| format!("table {}: {what}", layout.name);
    let calculator = PartitionValueCalculator::try_new(&layout.partition_spec, &layout.schema)
        .map_err(|e| Error::iceberg(ctx("partition transforms"), e))?;
    let values = calculator
        .calculate(batch)
        .map_err(|e| Error::iceberg(ctx("partition values"), e))?;
    let tuples = values
        .as_struct_opt()
        .ok_or_else(|| Error::Internal(ctx("partition values are not a struct")))?;
    let arrow = |e: arrow_schema::ArrowError| Error::Internal(ctx(&format!("split rows: {e}")));
    let converter = RowConverter::new(
        tuples
            .columns()
            .iter()
            .map(|c| SortField::new(c.data_type().clone()))
            .collect(),
    )
    .map_err(arrow)?;
    let rows = converter.convert_columns(tuples.columns()).map_err(arrow)?;

    let mut index: HashMap<arrow_row::Row<'_>, usize> = HashMap::new();
    let mut groups: Vec<Vec<u32>> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let at = *index.entry(row).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[at].push(i as u32);
    }

    let mut out = Vec::with_capacity(groups.len());
    for members in groups {
        let first = members[0] as usize;
        let one: ArrayRef = values.slice(first, 1);
        let tuple = match arrow_struct_to_literal(&one, calculator.partition_type())
            .map_err(|e| Error::iceberg(ctx("partition tuple"), e))?
            .pop()
        {
            Some(Some(Literal::Struct(s))) => s,
            _ => return Err(Error::Internal(ctx("partition tuple is not a struct"))),
        };
        let rows = if members.len() == batch.num_rows() {
            batch.clone()
        } else {
            arrow_select::take::take_record_batch(batch, &UInt32Array::from(members))
                .map_err(arrow)?
        };
        out.push((tuple, rows));
    }
    Ok(out)
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray, TimestampMicrosecondArray};
    use iceberg::arrow::RecordBatchPartitionSplitter;

    use super::*;
    use crate::spec::PipelineSpec;

    pub(in crate::table) fn layout(partition_by: &[&str]) -> TableLayout {
        let text = format!(
            r#"[[tables]]
name = "t"
topic = "t"
partition_by = [{}]
columns = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "country", type = "string" }},
  {{ name = "at", type = "timestamp", required = true }},
]"#,
            partition_by
                .iter()
                .map(|p| format!("{p:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let spec = PipelineSpec::parse(
            &text,
            std::path::Path::new("p.toml"),
            &crate::process::Planner,
        )
        .expect("spec");
        TableLayout::for_table(&spec.tables[0]).expect("layout")
    }

    pub(in crate::table) fn batch(
        layout: &TableLayout,
        rows: &[(i64, Option<&str>, i64)],
    ) -> RecordBatch {
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1))),
            Arc::new(TimestampMicrosecondArray::from_iter_values(
                rows.iter().map(|r| r.2),
            )),
        ];
        for field in layout.arrow_schema.fields().iter().skip(3) {
            let n = rows.len();
            columns.push(match field.data_type() {
                arrow_schema::DataType::Int32 => {
                    Arc::new(arrow_array::Int32Array::from(vec![0; n]))
                }
                arrow_schema::DataType::Int64 => Arc::new(Int64Array::from(vec![0; n])),
                arrow_schema::DataType::Timestamp(_, tz) => Arc::new(
                    TimestampMicrosecondArray::from(vec![0; n]).with_timezone_opt(tz.clone()),
                ),
                other => arrow_array::new_null_array(other, n),
            });
        }
        RecordBatch::try_new(layout.arrow_schema.clone(), columns).expect("batch")
    }

    /// The same groups, tuples and rows as Iceberg's splitter, whatever the order it gives them.
    #[test]
    fn splits_as_icebergs_splitter_does() {
        const DAY: i64 = 86_400_000_000;
        let rows: Vec<(i64, Option<&str>, i64)> = (0..200)
            .map(|i| {
                let country = [Some("DE"), None, Some("FR"), Some("null")][i as usize % 4];
                (i, country, (i % 7 - 3) * DAY + i * 1_000)
            })
            .collect();
        for partition_by in [
            vec!["day(at)"],
            vec!["country", "day(at)"],
            vec!["bucket(4, id)"],
        ] {
            let layout = layout(&partition_by);
            let batch = batch(&layout, &rows);
            let ours = split_by_partition(&layout, &batch).expect("split");
            let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(
                layout.schema.clone(),
                layout.partition_spec.clone(),
            )
            .expect("splitter");
            let mut theirs: Vec<(Struct, RecordBatch)> = splitter
                .split(&batch)
                .expect("split")
                .into_iter()
                .map(|(k, b)| (k.data().clone(), b))
                .collect();
            assert_eq!(ours.len(), theirs.len(), "{partition_by:?}");
            assert!(ours.len() > 1, "{partition_by:?}");
            for (tuple, rows) in &ours {
                let at = theirs
                    .iter()
                    .position(|(t, _)| t == tuple)
                    .unwrap_or_else(|| panic!("{partition_by:?}: no group {tuple:?}"));
                assert_eq!(rows, &theirs.remove(at).1, "{partition_by:?} {tuple:?}");
            }
            // Groups come in the order of their first row.
            let firsts: Vec<i64> = ours
                .iter()
                .map(|(_, b)| {
                    b.column(0)
                        .as_primitive::<arrow_array::types::Int64Type>()
                        .value(0)
                })
                .collect();
            assert!(firsts.is_sorted(), "{partition_by:?}: {firsts:?}");
        }
    }

    #[test]
    fn an_unpartitioned_table_is_one_group() {
        let layout = layout(&[]);
        let batch = batch(&layout, &[(1, None, 0), (2, Some("x"), 5)]);
        let split = split_by_partition(&layout, &batch).expect("split");
        assert_eq!(split.len(), 1);
        assert_eq!(split[0].1, batch);
    }
}
