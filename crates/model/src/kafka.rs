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

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_array::builder::{
    Int32Builder, Int64Builder, LargeBinaryBuilder, StringBuilder, TimestampMicrosecondBuilder,
};
use iceberg::spec::{NestedField, PrimitiveType, Type};

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

/// The Kafka columns, in the order they follow a table's own columns.
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

/// The Kafka columns' names, in order.
pub const NAMES: [&str; 5] = [PARTITION, OFFSET, TIMESTAMP, KEY, KEY_BYTES];

/// Whether `name` is one of the Kafka columns.
pub fn is_kafka_column(name: &str) -> bool {
    NAMES.contains(&name)
}

/// The Kafka columns' Iceberg fields, with ids from `first`.
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
}

/// The Arrow builders of the Kafka columns of one batch.
pub struct KafkaBuilders {
    partition: Int32Builder,
    offset: Int64Builder,
    timestamp: TimestampMicrosecondBuilder,
    key: StringBuilder,
    key_bytes: LargeBinaryBuilder,
}

impl KafkaBuilders {
    /// Builders sized for `capacity` rows.
    pub fn with_capacity(capacity: usize) -> Self {
        KafkaBuilders {
            partition: Int32Builder::with_capacity(capacity),
            offset: Int64Builder::with_capacity(capacity),
            timestamp: TimestampMicrosecondBuilder::with_capacity(capacity),
            key: StringBuilder::with_capacity(capacity, capacity * 16),
            key_bytes: LargeBinaryBuilder::new(),
        }
    }

    /// Appends one record's coordinates.
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
    }

    /// The columns appended so far, in [`COLUMNS`] order; the builders are empty afterwards.
    pub fn finish(&mut self) -> [ArrayRef; 5] {
        [
            Arc::new(self.partition.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.timestamp.finish()),
            Arc::new(self.key.finish()),
            Arc::new(self.key_bytes.finish()),
        ]
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
        assert!(is_kafka_column(OFFSET) && !is_kafka_column("kafka_headers"));
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
            });
        }
        let [_, offsets, _, key, key_bytes] = b.finish();
        assert_eq!(offsets.as_primitive::<Int64Type>().values(), &[1, 2, 3]);
        let key = key.as_string::<i32>();
        let key_bytes = key_bytes.as_binary::<i64>();
        assert_eq!((key.is_valid(0), key_bytes.is_valid(0)), (true, false));
        assert_eq!((key.is_valid(1), key_bytes.is_valid(1)), (false, true));
        assert_eq!(key_bytes.value(1), [0xff, 0x00]);
        assert_eq!((key.is_valid(2), key_bytes.is_valid(2)), (false, false));
    }
}
