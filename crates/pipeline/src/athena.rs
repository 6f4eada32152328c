//! What Athena (and so QuickSight) needs from an Iceberg table, checked: lowercase names,
//! format v2, `timestamp` (microseconds, no zone) for times, decimals within precision 38, only
//! types Athena reads (structs and lists of them too: struct columns, `kafka_headers`).

use iceberg::spec::{PrimitiveType, TableMetadata, Type};

/// Every way the table falls short of what Athena reads; empty when it is fine.
pub fn compatibility_problems(name: &str, metadata: &TableMetadata) -> Vec<String> {
    let mut problems = Vec::new();
    if !is_lowercase(name) {
        problems.push(format!(
            "table name {name:?} is not lowercase (Athena lowercases names)"
        ));
    }
    if metadata.format_version() != iceberg::spec::FormatVersion::V2 {
        problems.push(format!(
            "format version {} (Athena reads Iceberg v2)",
            metadata.format_version()
        ));
    }
    for f in metadata.current_schema().as_struct().fields() {
        if !is_lowercase(&f.name) {
            problems.push(format!("column {:?} is not a lowercase name", f.name));
        }
        column_problems(&f.name, &f.field_type, &mut problems);
    }
    problems
}

/// Whether `s` is a name as Athena keeps it (lowercase).
fn is_lowercase(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// What Athena cannot read in column `name` of type `ty`: a struct's fields and a list's
/// elements (`kafka_headers`, struct columns) are checked as columns of their own.
fn column_problems(name: &str, ty: &Type, problems: &mut Vec<String>) {
    match ty {
        Type::Primitive(p) => match p {
            PrimitiveType::Boolean
            | PrimitiveType::Int
            | PrimitiveType::Long
            | PrimitiveType::Float
            | PrimitiveType::Double
            | PrimitiveType::Date
            | PrimitiveType::String
            | PrimitiveType::Binary
            | PrimitiveType::Timestamp => {}
            PrimitiveType::Decimal { precision, .. } if *precision <= 38 => {}
            PrimitiveType::Decimal { precision, .. } => problems.push(format!(
                "column {name}: decimal precision {precision} over 38"
            )),
            PrimitiveType::Timestamptz
            | PrimitiveType::TimestamptzNs
            | PrimitiveType::TimestampNs => problems.push(format!(
                "column {name}: {p} (use timestamp: microseconds, no zone, holding UTC)"
            )),
            other => problems.push(format!(
                "column {name}: type {other} is not one streamtable writes for Athena"
            )),
        },
        Type::Struct(s) => {
            for f in s.fields() {
                let field = format!("{name}.{}", f.name);
                if !is_lowercase(&f.name) {
                    problems.push(format!("column {field:?} is not a lowercase name"));
                }
                column_problems(&field, &f.field_type, problems);
            }
        }
        Type::List(l) => {
            column_problems(&format!("{name}[]"), &l.element_field.field_type, problems)
        }
        other => problems.push(format!(
            "column {name}: nested type {other} is not one streamtable writes for Athena"
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use iceberg::spec::{NestedField, Schema, TableMetadataBuilder};

    use super::*;
    use crate::schema::TableLayout;

    fn metadata(schema: Schema) -> TableMetadata {
        TableMetadataBuilder::new(
            schema,
            iceberg::spec::PartitionSpec::unpartition_spec().into_unbound(),
            iceberg::spec::SortOrder::unsorted_order(),
            "/tmp/t".into(),
            iceberg::spec::FormatVersion::V2,
            Default::default(),
        )
        .and_then(|b| b.build())
        .expect("metadata")
        .metadata
    }

    #[test]
    fn every_example_table_is_athena_compatible() {
        let spec = crate::spec::PipelineSpec::parse(
            crate::config::BUILTIN_PIPELINE,
            Path::new("builtin"),
            &crate::process::Planner,
        )
        .expect("spec");
        // Topics' tables, derived tables (their columns inferred from SQL), reference tables.
        let mut layouts: Vec<_> = spec
            .landed_tables()
            .map(|t| TableLayout::for_table(t).expect("layout"))
            .collect();
        assert!(layouts.iter().any(|l| l.name == "orders_clean"));
        layouts.extend(
            spec.references
                .iter()
                .map(|r| TableLayout::for_reference(r).expect("layout")),
        );
        layouts.push(TableLayout::dead_letters().expect("dead letters"));
        for l in layouts {
            let m = metadata(l.schema.as_ref().clone());
            assert_eq!(
                compatibility_problems(&l.name, &m),
                Vec::<String>::new(),
                "{}",
                l.name
            );
        }
    }

    #[test]
    fn zoned_timestamps_and_uppercase_names_are_reported() {
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "At", Type::Primitive(PrimitiveType::Timestamptz)).into(),
            ])
            .build()
            .expect("schema");
        let problems = compatibility_problems("Orders", &metadata(schema));
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    #[test]
    fn a_table_with_kafka_headers_is_athena_compatible() {
        let spec = crate::spec::PipelineSpec::parse(
            "[[tables]]\nname = \"t\"\ntopic = \"t\"\nkafka_headers = true\ncolumns = [{ name = \"id\", type = \"string\" }]\n",
            Path::new("t.toml"),
            &crate::spec::NoSql,
        )
        .expect("spec");
        let layout = TableLayout::for_table(&spec.tables[0]).expect("layout");
        let m = metadata(layout.schema.as_ref().clone());
        assert_eq!(compatibility_problems("t", &m), Vec::<String>::new());
        #[cfg(feature = "aws")]
        {
            let headers = m
                .current_schema()
                .field_by_name("kafka_headers")
                .expect("headers");
            assert_eq!(
                crate::catalog::glue::hive_type(&headers.field_type),
                "array<struct<key:string,value:binary>>"
            );
        }
    }
}
