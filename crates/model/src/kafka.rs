//! The Kafka columns: the metadata every topic's table carries after its own columns, defined
//! once. [`COLUMNS`] is the table of them (name, Iceberg type, required, doc), in the order they
//! come in a table; [`fields`] gives their Iceberg fields, [`KafkaBuilders`] fills them from a
//! record's coordinates ([`RecordMeta`]), and the names ([`PARTITION`], [`OFFSET`], …) are what
//! the stages that read them back (windows, dedup, joins, replay) look them up by.
//!
//! The record key is stored losslessly: a UTF-8 key (the common case, and what QuickSight can
//! show) in `kafka_key`, any other key (Avro, long and UUID serializers) as its bytes in
//! `kafka_key_bytes`; at most one of the two is set, neither for a record without a key.
//! `kafka_key_bytes` came after the first release: the tables stage adds it to older tables.
//!
//! A table whose spec says `kafka_headers = true` also has [`HEADERS`] after those five: the
//! record's headers as `list<struct<key: string, value: binary>>`, in the record's order, a key
//! repeated as often as the record repeats it, a header without a value with a NULL `value`, an
//! empty list for a record without headers. Turning the option off later keeps the column (a
//! column is never dropped for it); its rows are then NULL. [`COLUMNS`] and [`NAMES`] are the
//! five every table has; [`is_kafka_column`] knows all six.

use std::sync::Arc;

use arrow_array::builder::{
    Int32Builder, Int64Builder, LargeBinaryBuilder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, ListArray, StructArray};
use arrow_buffer::{NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, Fields};
use iceberg::spec::{ListType, NestedField, PrimitiveType, StructType, Type};

use crate::error::{Error, Result};
use crate::esm::EsmHeader;

/// The Kafka partition of the record.
pub const PARTITION: &str = "kafka_partition";
/// The record's offset in its partition.
pub const OFFSET: &str = "kafka_offset";
/// The record's Kafka timestamp.
pub const TIMESTAMP: &str = "kafka_timestamp";
/// The record's key, when it is UTF-8.
pub const KEY: &str = "kafka_key";
/// The record's key's bytes, when they are not UTF-8.
pub const KEY_BYTES: &str = "kafka_key_bytes";
/// The record's headers, in tables whose spec asks for them (`kafka_headers = true`).
pub const HEADERS: &str = "kafka_headers";
/// The name of a header's key in [`HEADERS`]' entries.
pub const HEADER_KEY: &str = "key";
/// The name of a header's value in [`HEADERS`]' entries.
pub const HEADER_VALUE: &str = "value";

/// One Kafka column.
#[derive(Debug, Clone)]
pub struct KafkaColumn {
    /// Its name in every table.
    pub name: &'static str,
    /// Its Iceberg type.
    pub iceberg: PrimitiveType,
    /// Whether every row has it.
    pub required: bool,
    /// The doc the Iceberg field carries, if any.
    pub doc: Option<&'static str>,
}

/// The Kafka columns every table has, in the order they follow a table's own columns
/// ([`HEADERS`], where a table has it, comes after them).
pub const COLUMNS: [KafkaColumn; 5] = [
    KafkaColumn {
        name: PARTITION,
        iceberg: PrimitiveType::Int,
        required: true,
        doc: None,
    },
    KafkaColumn {
        name: OFFSET,
        iceberg: PrimitiveType::Long,
        required: true,
        doc: None,
    },
    KafkaColumn {
        name: TIMESTAMP,
        iceberg: PrimitiveType::Timestamp,
        required: true,
        doc: None,
    },
    KafkaColumn {
        name: KEY,
        iceberg: PrimitiveType::String,
        required: false,
        doc: Some("the record key, when it is UTF-8"),
    },
    KafkaColumn {
        name: KEY_BYTES,
        iceberg: PrimitiveType::Binary,
        required: false,
        doc: Some("the record key's bytes, when they are not UTF-8"),
    },
];

/// The names of the Kafka columns every table has, in order.
pub const NAMES: [&str; 5] = [PARTITION, OFFSET, TIMESTAMP, KEY, KEY_BYTES];

/// Whether `name` is one of the Kafka columns ([`HEADERS`] included).
pub fn is_kafka_column(name: &str) -> bool {
    NAMES.contains(&name) || name == HEADERS
}

/// The doc of the [`HEADERS`] column.
const HEADERS_DOC: &str = "the record's headers, in order (a key may repeat)";

/// The [`HEADERS`] column's Iceberg field (optional): id `id`, its list element `nested`, the
/// element's `key` (required) and `value` (optional) `nested + 1` and `nested + 2`, the ids
/// Iceberg gives a new column's nested fields, in that order.
pub fn headers_field(id: i32, nested: i32) -> NestedField {
    let entry = StructType::new(vec![
        Arc::new(NestedField::required(
            nested + 1,
            HEADER_KEY,
            Type::Primitive(PrimitiveType::String),
        )),
        Arc::new(NestedField::optional(
            nested + 2,
            HEADER_VALUE,
            Type::Primitive(PrimitiveType::Binary),
        )),
    ]);
    let list = ListType::new(Arc::new(NestedField::list_element(
        nested,
        Type::Struct(entry),
        true,
    )));
    NestedField::optional(id, HEADERS, Type::List(list)).with_doc(HEADERS_DOC)
}

/// How many ids [`headers_field`]'s nested fields take (the list element, key and value).
pub const HEADERS_NESTED_IDS: i32 = 3;

/// The Kafka columns' Iceberg fields, with ids from `first` (without [`HEADERS`]).
pub fn fields(first: i32) -> Vec<NestedField> {
    COLUMNS
        .iter()
        .zip(first..)
        .map(|(c, id)| {
            let ty = Type::Primitive(c.iceberg.clone());
            let field = if c.required {
                NestedField::required(id, c.name, ty)
            } else {
                NestedField::optional(id, c.name, ty)
            };
            match c.doc {
                Some(doc) => field.with_doc(doc),
                None => field,
            }
        })
        .collect()
}

/// Kafka coordinates of one record, as stored in the Kafka columns.
#[derive(Debug, Clone, Copy)]
pub struct RecordMeta<'a> {
    /// The Kafka partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
    /// The Kafka timestamp in microseconds, already checked to be in range.
    pub timestamp_us: i64,
    /// The key's bytes: stored in `kafka_key` when they are UTF-8, else in `kafka_key_bytes`.
    pub key: Option<&'a [u8]>,
    /// The record's headers, in order: stored in `kafka_headers` when the table has it.
    pub headers: &'a [EsmHeader],
}

/// The Arrow builders of the Kafka columns of one batch.
pub struct KafkaBuilders {
    partition: Int32Builder,
    offset: Int64Builder,
    timestamp: TimestampMicrosecondBuilder,
    key: StringBuilder,
    key_bytes: LargeBinaryBuilder,
    headers: Option<HeadersBuilder>,
}

impl KafkaBuilders {
    /// Builders sized for `capacity` rows, for the five columns every table has.
    pub fn with_capacity(capacity: usize) -> Self {
        KafkaBuilders {
            partition: Int32Builder::with_capacity(capacity),
            offset: Int64Builder::with_capacity(capacity),
            timestamp: TimestampMicrosecondBuilder::with_capacity(capacity),
            key: StringBuilder::with_capacity(capacity, capacity * 16),
            key_bytes: LargeBinaryBuilder::new(),
            headers: None,
        }
    }

    /// The same builders also filling [`HEADERS`], whose field in the table's Arrow schema is
    /// `field`: with each record's headers when `store` (the spec asks for them), else NULL (a
    /// table that keeps the column after its spec stopped asking).
    pub fn with_headers(mut self, field: &Field, store: bool) -> Result<Self> {
        self.headers = Some(HeadersBuilder::new(field, store)?);
        Ok(self)
    }

    /// How many columns [`KafkaBuilders::finish`] returns: five, six with [`HEADERS`].
    pub fn columns(&self) -> usize {
        COLUMNS.len() + usize::from(self.headers.is_some())
    }

    /// Appends one record's coordinates (and headers).
    pub fn append(&mut self, meta: &RecordMeta<'_>) {
        self.partition.append_value(meta.partition);
        self.offset.append_value(meta.offset);
        self.timestamp.append_value(meta.timestamp_us);
        match meta.key.map(std::str::from_utf8) {
            None => {
                self.key.append_null();
                self.key_bytes.append_null();
            }
            Some(Ok(text)) => {
                self.key.append_value(text);
                self.key_bytes.append_null();
            }
            Some(Err(_)) => {
                self.key.append_null();
                self.key_bytes.append_option(meta.key);
            }
        }
        if let Some(h) = &mut self.headers {
            h.append(meta.headers);
        }
    }

    /// The columns appended so far, in [`COLUMNS`] order then [`HEADERS`] (when built); the
    /// builders are empty afterwards.
    pub fn finish(&mut self) -> Result<Vec<ArrayRef>> {
        let mut out: Vec<ArrayRef> = vec![
            Arc::new(self.partition.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.timestamp.finish()),
            Arc::new(self.key.finish()),
            Arc::new(self.key_bytes.finish()),
        ];
        if let Some(h) = &mut self.headers {
            out.push(h.finish()?);
        }
        Ok(out)
    }
}

/// The builder of the [`HEADERS`] column: the entries' keys and values, and each row's offsets
/// into them.
struct HeadersBuilder {
    /// The list's element field (with its field id), as the table's Arrow schema has it.
    element: FieldRef,
    /// The element's fields (key, value).
    entry: Fields,
    /// Whether the records' headers are stored (else every row is NULL).
    store: bool,
    keys: StringBuilder,
    values: LargeBinaryBuilder,
    offsets: Vec<i32>,
    nulls: NullBufferBuilder,
}

impl HeadersBuilder {
    fn new(field: &Field, store: bool) -> Result<Self> {
        let wrong = || {
            Error::Internal(format!(
                "column {HEADERS} is of type {}, not a list of (key string, value binary)",
                field.data_type()
            ))
        };
        let DataType::List(element) = field.data_type() else {
            return Err(wrong());
        };
        let DataType::Struct(entry) = element.data_type() else {
            return Err(wrong());
        };
        let types: Vec<&DataType> = entry.iter().map(|f| f.data_type()).collect();
        if types != [&DataType::Utf8, &DataType::LargeBinary] {
            return Err(wrong());
        }
        Ok(HeadersBuilder {
            element: element.clone(),
            entry: entry.clone(),
            store,
            keys: StringBuilder::new(),
            values: LargeBinaryBuilder::new(),
            offsets: vec![0],
            nulls: NullBufferBuilder::new(0),
        })
    }

    fn append(&mut self, headers: &[EsmHeader]) {
        let mut end = self.offsets.last().copied().unwrap_or(0);
        if self.store {
            for h in headers {
                self.keys.append_value(&h.key);
                self.values.append_option(h.value.as_deref());
            }
            end += headers.len() as i32;
            self.nulls.append_non_null();
        } else {
            self.nulls.append_null();
        }
        self.offsets.push(end);
    }

    fn finish(&mut self) -> Result<ArrayRef> {
        let entries = StructArray::try_new(
            self.entry.clone(),
            vec![Arc::new(self.keys.finish()), Arc::new(self.values.finish())],
            None,
        )
        .map_err(|e| Error::Internal(format!("column {HEADERS}: {e}")))?;
        let offsets = std::mem::replace(&mut self.offsets, vec![0]);
        let list = ListArray::try_new(
            self.element.clone(),
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Arc::new(entries),
            self.nulls.finish(),
        )
        .map_err(|e| Error::Internal(format!("column {HEADERS}: {e}")))?;
        Ok(Arc::new(list))
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;

    use super::*;

    #[test]
    fn the_table_names_types_and_ids_agree() {
        let f = fields(8);
        let names: Vec<&str> = f.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, NAMES);
        assert_eq!(
            f.iter().map(|f| f.id).collect::<Vec<_>>(),
            [8, 9, 10, 11, 12]
        );
        assert!(f[0].required && f[1].required && f[2].required);
        assert!(!f[3].required && !f[4].required);
        assert!(is_kafka_column(OFFSET) && is_kafka_column("kafka_headers"));
        assert!(!is_kafka_column("kafka_value") && !NAMES.contains(&HEADERS));
        let h = headers_field(13, 20);
        assert_eq!((h.name.as_str(), h.id, h.required), (HEADERS, 13, false));
        let Type::List(list) = h.field_type.as_ref() else {
            panic!("{:?}", h.field_type);
        };
        let Type::Struct(entry) = list.element_field.field_type.as_ref() else {
            panic!("{:?}", list.element_field.field_type);
        };
        let ids: Vec<i32> = std::iter::once(list.element_field.id)
            .chain(entry.fields().iter().map(|f| f.id))
            .collect();
        assert_eq!(ids, [20, 21, 22]);
        assert_eq!(ids.len() as i32, HEADERS_NESTED_IDS);
    }

    #[test]
    fn a_key_lands_in_one_column_by_whether_it_is_utf8() {
        let mut b = KafkaBuilders::with_capacity(3);
        for (offset, key) in [
            (1, Some(&b"k"[..])),
            (2, Some(&[0xff, 0x00][..])),
            (3, None),
        ] {
            b.append(&RecordMeta {
                partition: 0,
                offset,
                timestamp_us: 0,
                key,
                headers: &[],
            });
        }
        assert_eq!(b.columns(), 5);
        let Ok([_, offsets, _, key, key_bytes]) =
            <[ArrayRef; 5]>::try_from(b.finish().expect("finish"))
        else {
            panic!("five columns");
        };
        assert_eq!(offsets.as_primitive::<Int64Type>().values(), &[1, 2, 3]);
        let key = key.as_string::<i32>();
        let key_bytes = key_bytes.as_binary::<i64>();
        assert_eq!((key.is_valid(0), key_bytes.is_valid(0)), (true, false));
        assert_eq!((key.is_valid(1), key_bytes.is_valid(1)), (false, true));
        assert_eq!(key_bytes.value(1), [0xff, 0x00]);
        assert_eq!((key.is_valid(2), key_bytes.is_valid(2)), (false, false));
    }
}
