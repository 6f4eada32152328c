//! Schema mapping: a [`TableSpec`] becomes an Iceberg schema, partition spec and Arrow schema.
//!
//! Field ids are assigned in order, business columns first (1..n) then the Kafka metadata
//! columns, then the nested fields (struct columns' fields, `kafka_headers`' element, key and
//! value), which is also the order in which Iceberg assigns fresh ids when a table is created,
//! so the Parquet files written by ingest carry the ids the table will have.

use std::sync::Arc;

pub mod evolve;

use arrow_schema::SchemaRef as ArrowSchemaRef;
use iceberg::spec::{
    NestedField, PartitionSpec, PrimitiveType, Schema, SchemaRef, StructType, Transform, Type,
};

use crate::error::{Error, Result};
use crate::kafka;
use crate::spec::{ColumnSpec, ColumnType, DEAD_LETTER_TABLE, ReferenceSpec, TableSpec};

/// Everything a writer needs to know about a table's layout.
#[derive(Debug, Clone)]
pub struct TableLayout {
    /// Table name.
    pub name: String,
    /// Iceberg schema.
    pub schema: SchemaRef,
    /// Iceberg partition spec (spec id 0).
    pub partition_spec: Arc<PartitionSpec>,
    /// Struct type of the partition tuple.
    pub partition_type: StructType,
    /// Arrow schema with Parquet field-id metadata, in schema order.
    pub arrow_schema: ArrowSchemaRef,
}

impl TableLayout {
    fn build(
        name: &str,
        fields: Vec<NestedField>,
        partitions: &[(String, String, Transform)],
    ) -> Result<Self> {
        let ctx = |what: &str| format!("table {name}: {what}");
        let schema = Schema::builder()
            .with_schema_id(0)
            .with_fields(fields.into_iter().map(Arc::new))
            .build()
            .map_err(|e| Error::iceberg(ctx("schema"), e))?;
        let schema = Arc::new(schema);
        let mut builder = PartitionSpec::builder(schema.clone()).with_spec_id(0);
        for (source, target, transform) in partitions {
            builder = builder
                .add_partition_field(source, target, *transform)
                .map_err(|e| Error::iceberg(ctx("partition spec"), e))?;
        }
        let partition_spec = builder
            .build()
            .map_err(|e| Error::iceberg(ctx("partition spec"), e))?;
        Self::of_table(name, schema, Arc::new(partition_spec))
    }

    /// The layout of a table as the catalog has it: its current schema (field ids included)
    /// and default partition spec. Files written with it carry the table's own ids, whatever
    /// the evolution the table went through.
    pub fn of_table(
        name: &str,
        schema: SchemaRef,
        partition_spec: Arc<PartitionSpec>,
    ) -> Result<Self> {
        let ctx = |what: &str| format!("table {name}: {what}");
        let partition_type = partition_spec
            .partition_type(&schema)
            .map_err(|e| Error::iceberg(ctx("partition type"), e))?;
        let arrow_schema = iceberg::arrow::schema_to_arrow_schema(&schema)
            .map_err(|e| Error::iceberg(ctx("arrow schema"), e))?;
        Ok(TableLayout {
            name: name.to_string(),
            schema,
            partition_spec,
            partition_type,
            arrow_schema: Arc::new(arrow_schema),
        })
    }

    /// Whether `other` has the same columns (names, types, nullability, order) and partitioning,
    /// whatever the field ids: the rows one builds fit the other.
    pub fn same_shape(&self, other: &TableLayout) -> bool {
        self.shape() == other.shape() && self.partitioning() == other.partitioning()
    }

    /// Whether this layout (the catalog's) can stand for `spec` (the spec's layout) when rows
    /// of the spec's table are written: the same shape, or the same but for a `kafka_headers`
    /// column at the end that the spec no longer asks for (the table keeps it, and rows built
    /// with this layout leave it NULL).
    pub fn fits(&self, spec: &TableLayout) -> bool {
        if self.same_shape(spec) {
            return true;
        }
        let (mine, theirs) = (self.shape(), spec.shape());
        self.partitioning() == spec.partitioning()
            && !theirs.iter().any(|(name, _, _)| name == kafka::HEADERS)
            && mine
                .split_last()
                .is_some_and(|(last, rest)| last.0 == kafka::HEADERS && rest == theirs)
    }

    /// Whether the layout has the `kafka_headers` column.
    pub fn has_headers(&self) -> bool {
        self.arrow_schema.column_with_name(kafka::HEADERS).is_some()
    }

    /// The columns' names, types (without field ids) and nullability, in order.
    fn shape(&self) -> Vec<(String, arrow_schema::DataType, bool)> {
        self.arrow_schema
            .fields()
            .iter()
            .map(|f| {
                (
                    f.name().clone(),
                    without_ids(f.data_type()),
                    f.is_nullable(),
                )
            })
            .collect()
    }

    /// The partitioning as written in specs and messages: `["day(created_at)"]`. Pending files
    /// carry it, so that a file is never registered under another partitioning.
    pub fn partitioning(&self) -> Vec<String> {
        describe_partitioning(&self.partition_spec, &self.schema)
    }

    /// The layout of a table from the pipeline spec: its columns, then the Kafka columns
    /// (`kafka_headers` last, when the spec asks for it).
    pub fn for_table(spec: &TableSpec) -> Result<Self> {
        // Ids as Iceberg assigns them at creation: the top level first (the columns, then the
        // Kafka columns), then each struct's fields, its own structs' before the next struct's,
        // then `kafka_headers`' element and the element's key and value.
        let n = spec.columns.len() as i32;
        let kafka_n = kafka::COLUMNS.len() as i32 + i32::from(spec.kafka_headers);
        let mut next = n + kafka_n + 1;
        let mut fields = fields_with_ids(&spec.columns, 1, &mut next);
        fields.extend(kafka::fields(n + 1));
        if spec.kafka_headers {
            fields.push(kafka::headers_field(n + kafka_n, next));
        }
        let partitions: Vec<_> = spec
            .partition_by
            .iter()
            .map(|p| (p.source.clone(), p.field_name(), p.transform))
            .collect();
        Self::build(&spec.name, fields, &partitions)
    }

    /// The layout of a reference table: its declared columns, unpartitioned, no Kafka columns.
    pub fn for_reference(spec: &ReferenceSpec) -> Result<Self> {
        let mut next = spec.columns.len() as i32 + 1;
        let fields = fields_with_ids(&spec.columns, 1, &mut next);
        Self::build(&spec.name, fields, &[])
    }

    /// The layout of the dead-letter table, partitioned by day of `failed_at`.
    pub fn dead_letters() -> Result<Self> {
        use PrimitiveType as P;
        let p = |t| Type::Primitive(t);
        let fields = vec![
            NestedField::required(1, "topic", p(P::String)),
            NestedField::required(2, "kafka_partition", p(P::Int)),
            NestedField::required(3, "kafka_offset", p(P::Long)),
            NestedField::optional(4, "kafka_timestamp", p(P::Timestamp)),
            NestedField::optional(5, "kafka_key", p(P::Binary)),
            NestedField::optional(6, "kafka_value", p(P::Binary)),
            NestedField::required(7, "error_kind", p(P::String)),
            NestedField::required(8, "error_message", p(P::String)),
            NestedField::required(9, "failed_at", p(P::Timestamp)),
        ];
        Self::build(
            DEAD_LETTER_TABLE,
            fields,
            &[("failed_at".into(), "failed_at_day".into(), Transform::Day)],
        )
    }
}

/// `["day(created_at)", "bucket[16](id)"]`: a partition spec with its source columns named.
pub fn describe_partitioning(spec: &PartitionSpec, schema: &Schema) -> Vec<String> {
    spec.fields()
        .iter()
        .map(|f| {
            let source = schema
                .field_by_id(f.source_id)
                .map_or_else(|| format!("#{}", f.source_id), |c| c.name.clone());
            format!("{}({source})", f.transform)
        })
        .collect()
}

/// `ty` without the field ids of nested fields (a struct's fields and a list's element carry
/// theirs as metadata).
fn without_ids(ty: &arrow_schema::DataType) -> arrow_schema::DataType {
    use arrow_schema::{DataType, Field};
    let bare = |f: &Field| Field::new(f.name(), without_ids(f.data_type()), f.is_nullable());
    match ty {
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(|f| bare(f)).collect()),
        DataType::List(element) => DataType::List(Arc::new(bare(element))),
        DataType::LargeList(element) => DataType::LargeList(Arc::new(bare(element))),
        DataType::Map(entries, sorted) => DataType::Map(Arc::new(bare(entries)), *sorted),
        other => other.clone(),
    }
}

/// The fields of `columns`, numbered from `first`; struct fields' fields numbered from `next`
/// (which moves past them), in the order Iceberg assigns fresh ids.
pub fn fields_with_ids(columns: &[ColumnSpec], first: i32, next: &mut i32) -> Vec<NestedField> {
    columns
        .iter()
        .zip(first..)
        .map(|(c, id)| {
            let ty = if c.column_type == ColumnType::Struct {
                let child_first = *next;
                *next += c.fields.len() as i32;
                let children = fields_with_ids(&c.fields, child_first, next);
                Type::Struct(StructType::new(
                    children.into_iter().map(Arc::new).collect(),
                ))
            } else {
                Type::Primitive(primitive(c.column_type))
            };
            if c.required {
                NestedField::required(id, &c.name, ty)
            } else {
                NestedField::optional(id, &c.name, ty)
            }
        })
        .collect()
}

/// The Iceberg type of a spec column type (a struct's is an empty struct: its fields are in the
/// column, see [`fields_with_ids`]).
pub fn primitive(t: ColumnType) -> PrimitiveType {
    match t {
        ColumnType::String => PrimitiveType::String,
        ColumnType::Int => PrimitiveType::Int,
        ColumnType::Long => PrimitiveType::Long,
        ColumnType::Float => PrimitiveType::Float,
        ColumnType::Double => PrimitiveType::Double,
        ColumnType::Boolean => PrimitiveType::Boolean,
        ColumnType::Date => PrimitiveType::Date,
        ColumnType::Timestamp => PrimitiveType::Timestamp,
        // Never asked: a struct column's type is built from its fields.
        ColumnType::Struct => PrimitiveType::Binary,
        ColumnType::Decimal { precision, scale } => PrimitiveType::Decimal {
            precision: precision as u32,
            scale: scale as u32,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use arrow_schema::DataType;

    use super::*;
    use crate::spec::PipelineSpec;

    /// Nested structs: the ids the layout writes files with are those Iceberg assigns when it
    /// creates the table from the layout's schema.
    #[test]
    fn struct_field_ids_are_the_ids_table_creation_assigns() {
        let text = r#"
[[tables]]
name = "t"
topic = "t"
columns = [
  { name = "a", type = "string" },
  { name = "s", type = "struct", fields = [
      { name = "x", type = "int" },
      { name = "inner", type = "struct", fields = [{ name = "deep", type = "long" }] },
      { name = "y", type = "string" },
  ] },
  { name = "u", type = "struct", fields = [{ name = "z", type = "date" }] },
  { name = "b", type = "double" },
]
"#;
        let spec =
            PipelineSpec::parse(text, Path::new("t.toml"), &crate::spec::NoSql).expect("spec");
        let layout = TableLayout::for_table(&spec.tables[0]).expect("layout");
        let creation = iceberg::TableCreation::builder()
            .name("t".into())
            .location("file:///tmp/t".into())
            .schema(layout.schema.as_ref().clone())
            .build();
        let created = iceberg::spec::TableMetadataBuilder::from_table_creation(creation)
            .and_then(|b| b.build())
            .expect("metadata")
            .metadata;
        assert_eq!(
            created.current_schema().as_struct(),
            layout.schema.as_struct()
        );
        let id = |name: &str| layout.schema.field_by_name(name).map(|f| f.id);
        assert_eq!(id("s.inner.deep"), Some(13));
        assert_eq!(id("u.z"), Some(14));
        assert_eq!(id("kafka_partition"), Some(5));
    }

    /// `kafka_headers`: the last top-level column, its element and the element's key and value
    /// numbered after every struct column's fields, as table creation numbers them.
    #[test]
    fn the_headers_column_has_its_type_and_the_ids_table_creation_assigns() {
        let text = r#"
[[tables]]
name = "t"
topic = "t"
kafka_headers = true
columns = [
  { name = "a", type = "string" },
  { name = "s", type = "struct", fields = [
      { name = "x", type = "int" },
      { name = "inner", type = "struct", fields = [{ name = "deep", type = "long" }] },
  ] },
  { name = "b", type = "double" },
]
"#;
        let spec =
            PipelineSpec::parse(text, Path::new("t.toml"), &crate::spec::NoSql).expect("spec");
        let layout = TableLayout::for_table(&spec.tables[0]).expect("layout");
        let creation = iceberg::TableCreation::builder()
            .name("t".into())
            .location("file:///tmp/t".into())
            .schema(layout.schema.as_ref().clone())
            .build();
        let created = iceberg::spec::TableMetadataBuilder::from_table_creation(creation)
            .and_then(|b| b.build())
            .expect("metadata")
            .metadata;
        assert_eq!(
            created.current_schema().as_struct(),
            layout.schema.as_struct()
        );
        let top: Vec<&str> = layout
            .schema
            .as_struct()
            .fields()
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(top[3..8], kafka::NAMES);
        assert_eq!(top[8..], [kafka::HEADERS]);
        let id = |name: &str| layout.schema.field_by_name(name).map(|f| f.id);
        assert_eq!(id("kafka_key_bytes"), Some(8));
        assert_eq!(id("kafka_headers"), Some(9));
        assert_eq!(id("s.inner.deep"), Some(12));
        let headers = layout
            .schema
            .field_by_name("kafka_headers")
            .expect("headers");
        assert!(!headers.required);
        let Type::List(list) = headers.field_type.as_ref() else {
            panic!("{:?}", headers.field_type);
        };
        assert_eq!(list.element_field.id, 13);
        assert!(list.element_field.required);
        let Type::Struct(entry) = list.element_field.field_type.as_ref() else {
            panic!("{:?}", list.element_field.field_type);
        };
        let entry: Vec<(i32, &str, bool, &Type)> = entry
            .fields()
            .iter()
            .map(|f| (f.id, f.name.as_str(), f.required, f.field_type.as_ref()))
            .collect();
        assert_eq!(
            entry,
            [
                (14, "key", true, &Type::Primitive(PrimitiveType::String)),
                (15, "value", false, &Type::Primitive(PrimitiveType::Binary)),
            ]
        );
        // Arrow: a list of (Utf8, LargeBinary), the ids carried as field metadata.
        let field = layout
            .arrow_schema
            .field_with_name("kafka_headers")
            .expect("field");
        let DataType::List(element) = field.data_type() else {
            panic!("{}", field.data_type());
        };
        assert_eq!(
            element
                .metadata()
                .get("PARQUET:field_id")
                .map(String::as_str),
            Some("13")
        );
        let DataType::Struct(fields) = element.data_type() else {
            panic!("{}", element.data_type());
        };
        assert_eq!(fields[0].data_type(), &DataType::Utf8);
        assert_eq!(fields[1].data_type(), &DataType::LargeBinary);
        // The same shape as a layout whose ids differ (an evolved table's).
        let evolved_ids = TableLayout::build(
            "t",
            layout
                .schema
                .as_struct()
                .fields()
                .iter()
                .map(|f| match f.name.as_str() {
                    "kafka_headers" => kafka::headers_field(f.id, 40),
                    _ => f.as_ref().clone(),
                })
                .collect(),
            &[],
        )
        .expect("layout");
        assert!(evolved_ids.same_shape(&layout));
    }

    #[test]
    fn dead_letter_layout_stores_raw_bytes_as_binary() {
        let layout = TableLayout::dead_letters().expect("layout");
        assert_eq!(layout.arrow_schema.field(5).name(), "kafka_value");
        assert_eq!(
            layout.arrow_schema.field(5).data_type(),
            &DataType::LargeBinary
        );
        assert_eq!(layout.partition_spec.fields()[0].name, "failed_at_day");
    }
}
