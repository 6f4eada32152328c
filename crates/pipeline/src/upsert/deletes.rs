//! Position delete files (Iceberg v2): `file_path`, `pos`, sorted by both, one file per
//! partition of the data files they name (a position delete applies within its partition).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, Struct};
use iceberg::table::Table;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use super::read::{DELETE_FILE_PATH_ID, DELETE_POS_ID};
use crate::error::{Error, Result};

/// Deletes of one partition: the data files' partition spec and value, and (path, position).
#[derive(Debug)]
pub struct PartitionDeletes {
    /// The partition spec of the data files.
    pub spec_id: i32,
    /// Their partition value.
    pub partition: Struct,
    /// The path of the partition's files relative to `data/` (`day=…`), for the file's name.
    pub path: String,
    /// Data file path → positions, sorted and distinct.
    pub rows: Vec<(String, Vec<u64>)>,
}

impl PartitionDeletes {
    /// Rows it deletes.
    pub fn len(&self) -> usize {
        self.rows.iter().map(|(_, p)| p.len()).sum()
    }

    /// Whether it deletes nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Groups deletes (data file path → positions) by partition; `where_is` gives a data file's
/// spec, partition value and partition path (asked once a file).
pub fn by_partition<'a>(
    deletes: BTreeMap<String, Vec<u64>>,
    where_is: impl Fn(&str) -> Option<(i32, &'a Struct, String)>,
) -> Result<Vec<PartitionDeletes>> {
    // By the partition's value, not its path: a null and the string "null" share a path.
    let mut groups: HashMap<(i32, Struct), PartitionDeletes> = HashMap::new();
    for (file, mut positions) in deletes {
        positions.sort_unstable();
        positions.dedup();
        let Some((spec_id, partition, path)) = where_is(&file) else {
            return Err(Error::Internal(format!(
                "a row to delete is in {file}, which is not a live file of the table"
            )));
        };
        groups
            .entry((spec_id, partition.clone()))
            .or_insert_with(|| PartitionDeletes {
                spec_id,
                partition: partition.clone(),
                path,
                rows: Vec::new(),
            })
            .rows
            .push((file, positions));
    }
    let mut out: Vec<PartitionDeletes> = groups.into_values().collect();
    out.sort_by(|a, b| (a.spec_id, &a.path).cmp(&(b.spec_id, &b.path)));
    Ok(out)
}

/// Writes one partition's position delete file at `location` and describes it.
pub async fn write(
    table: &Table,
    mut deletes: PartitionDeletes,
    location: &str,
) -> Result<DataFile> {
    // Sorted by path, then position (the spec's order for position delete files).
    deletes.rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let count = deletes.len();
    let id = |f: Field, id: i32| {
        f.with_metadata(HashMap::from([(
            "PARQUET:field_id".to_string(),
            id.to_string(),
        )]))
    };
    let schema = Arc::new(Schema::new(vec![
        id(
            Field::new("file_path", DataType::Utf8, false),
            DELETE_FILE_PATH_ID,
        ),
        id(Field::new("pos", DataType::Int64, false), DELETE_POS_ID),
    ]));
    // Collected first: a flattened iterator has no exact size, which Arrow's builders need.
    let paths: Vec<&str> = deletes
        .rows
        .iter()
        .flat_map(|(p, q)| std::iter::repeat_n(p.as_str(), q.len()))
        .collect();
    let positions: Vec<i64> = deletes
        .rows
        .iter()
        .flat_map(|(_, q)| q.iter().map(|q| i64::try_from(*q).unwrap_or(i64::MAX)))
        .collect();
    let paths: ArrayRef = Arc::new(StringArray::from(paths));
    let positions: ArrayRef = Arc::new(Int64Array::from(positions));
    let batch = RecordBatch::try_new(schema.clone(), vec![paths, positions])
        .map_err(|e| Error::Internal(format!("position deletes {location}: {e}")))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap_or_default()))
        .build();
    let mut buf = Vec::new();
    {
        let mut w = ArrowWriter::try_new(&mut buf, schema, Some(props))
            .map_err(|e| Error::Internal(format!("position deletes {location}: {e}")))?;
        w.write(&batch)
            .map_err(|e| Error::Internal(format!("position deletes {location}: {e}")))?;
        w.close()
            .map_err(|e| Error::Internal(format!("position deletes {location}: {e}")))?;
    }
    let size = buf.len() as u64;
    table
        .file_io()
        .new_output(location)
        .map_err(|e| Error::iceberg(location.to_string(), e))?
        .write(bytes::Bytes::from(buf))
        .await
        .map_err(|e| Error::iceberg(format!("write {location}"), e))?;
    DataFileBuilder::default()
        .content(DataContentType::PositionDeletes)
        .file_path(location.to_string())
        .file_format(DataFileFormat::Parquet)
        .partition(deletes.partition)
        .partition_spec_id(deletes.spec_id)
        .record_count(count as u64)
        .file_size_in_bytes(size)
        .build()
        .map_err(|e| Error::Internal(format!("{location}: delete file description: {e}")))
}
