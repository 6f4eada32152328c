//! Table pointers in the AWS Glue Data Catalog, as Athena reads them: `table_type=ICEBERG`,
//! `metadata_location` in the table parameters, and StorageDescriptor columns equal to the
//! Iceberg schema (so Athena and QuickSight list the columns). The swap is `UpdateTable` with
//! the `VersionId` read by `GetTable`; Glue refuses it with `ConcurrentModificationException`
//! when another writer updated the table in between.
//!
//! That refusal does not say the swap did not happen: when the response to a successful
//! `UpdateTable` is lost, the SDK sends the request again with the same `VersionId`, and Glue
//! refuses the repeat. So it is reported as an unknown outcome (an error), never as a lost race;
//! [`super::TableCatalog::commit_metadata`] then reads the pointer to learn what happened.

use async_trait::async_trait;
use aws_sdk_glue::Client;
use aws_sdk_glue::operation::create_table::CreateTableError;
use aws_sdk_glue::operation::update_table::UpdateTableError;
use aws_sdk_glue::types::{Column, DatabaseInput, StorageDescriptor, TableInput};
use iceberg::spec::{PrimitiveType, TableMetadata, Type};

use super::{Pointer, PointerStore};
use crate::aws::SdkFault;
use crate::error::{Error, Result};

/// Glue table pointers.
#[derive(Debug, Clone)]
pub struct GluePointers {
    client: Client,
}

fn glue_error(op: &'static str, what: &str, f: SdkFault) -> Error {
    Error::State {
        op,
        message: format!("Glue {what}: {}", f.message),
        retryable: f.retryable,
    }
}

/// The Hive type Glue and Athena show for an Iceberg type.
pub fn hive_type(t: &Type) -> String {
    match t {
        Type::Primitive(p) => match p {
            PrimitiveType::Boolean => "boolean".into(),
            PrimitiveType::Int => "int".into(),
            PrimitiveType::Long => "bigint".into(),
            PrimitiveType::Float => "float".into(),
            PrimitiveType::Double => "double".into(),
            PrimitiveType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            PrimitiveType::Date => "date".into(),
            PrimitiveType::Time | PrimitiveType::String | PrimitiveType::Uuid => "string".into(),
            PrimitiveType::Timestamp | PrimitiveType::TimestampNs => "timestamp".into(),
            PrimitiveType::Timestamptz | PrimitiveType::TimestamptzNs => "timestamp".into(),
            PrimitiveType::Fixed(_) | PrimitiveType::Binary => "binary".into(),
        },
        Type::Struct(s) => format!(
            "struct<{}>",
            s.fields()
                .iter()
                .map(|f| format!("{}:{}", f.name, hive_type(&f.field_type)))
                .collect::<Vec<_>>()
                .join(",")
        ),
        Type::List(l) => format!("array<{}>", hive_type(&l.element_field.field_type)),
        Type::Map(m) => format!(
            "map<{},{}>",
            hive_type(&m.key_field.field_type),
            hive_type(&m.value_field.field_type)
        ),
    }
}

/// The Glue `TableInput` describing an Iceberg table at `metadata_location`.
pub fn table_input(
    table: &str,
    metadata: &TableMetadata,
    metadata_location: &str,
    previous: Option<&str>,
) -> Result<TableInput> {
    let columns = metadata
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| {
            let mut c = Column::builder()
                .name(&f.name)
                .r#type(hive_type(&f.field_type));
            if let Some(doc) = &f.doc {
                c = c.comment(doc);
            }
            c.build()
                .map_err(|e| Error::Internal(format!("Glue column {}: {e}", f.name)))
        })
        .collect::<Result<Vec<_>>>()?;
    let sd = StorageDescriptor::builder()
        .location(metadata.location())
        .set_columns(Some(columns))
        .build();
    let mut input = TableInput::builder()
        .name(table)
        .table_type("EXTERNAL_TABLE")
        .storage_descriptor(sd)
        .parameters("table_type", "ICEBERG")
        .parameters("metadata_location", metadata_location);
    if let Some(p) = previous {
        input = input.parameters("previous_metadata_location", p);
    }
    input
        .build()
        .map_err(|e| Error::Internal(format!("Glue table input {table}: {e}")))
}

/// The Glue `TableInput` of an Athena view: `VIRTUAL_VIEW`, with the view's definition in
/// Presto's format (`/* Presto View: <base64 JSON> */`) and its columns in the storage descriptor.
pub fn view_input(namespace: &str, view: &crate::spec::ViewSpec) -> Result<TableInput> {
    use base64::Engine as _;
    let partials = crate::spec::partials_table(&view.name);
    // Athena resolves names in the view's schema; qualify the table anyway.
    let sql = view.athena_sql.replace(
        &format!("FROM {partials} "),
        &format!("FROM \"{namespace}\".\"{partials}\" "),
    );
    let definition = serde_json::json!({
        "originalSql": sql,
        "catalog": "awsdatacatalog",
        "schema": namespace,
        "columns": view.columns.iter().map(|(n, t)| serde_json::json!({"name": n, "type": t})).collect::<Vec<_>>(),
        "owner": "streamtable",
        "runAsInvoker": false,
        "properties": {},
    });
    let encoded = base64::engine::general_purpose::STANDARD.encode(definition.to_string());
    let mut sd = StorageDescriptor::builder();
    for (name, t) in &view.columns {
        sd = sd.columns(
            Column::builder()
                .name(name)
                .r#type(hive_of_trino(t))
                .build()
                .map_err(|e| Error::Internal(format!("Glue view column {name}: {e}")))?,
        );
    }
    TableInput::builder()
        .name(&view.name)
        .table_type("VIRTUAL_VIEW")
        .view_original_text(format!("/* Presto View: {encoded} */"))
        .view_expanded_text("/* Presto View */")
        .parameters("presto_view", "true")
        .parameters("comment", "Presto View")
        .parameters("streamtable.view.of", partials)
        .storage_descriptor(sd.build())
        .build()
        .map_err(|e| Error::Internal(format!("Glue view input {}: {e}", view.name)))
}

/// The Hive type Glue lists for a Trino type.
fn hive_of_trino(t: &str) -> String {
    match t {
        "varchar" => "string".into(),
        "integer" => "int".into(),
        "real" => "float".into(),
        t if t.starts_with("timestamp") => "timestamp".into(),
        t => t.into(),
    }
}

impl GluePointers {
    /// Pointers in Glue through a client built once by the caller.
    pub fn new(client: Client) -> Self {
        GluePointers { client }
    }
}

#[async_trait]
impl PointerStore for GluePointers {
    async fn ensure_namespace(&self, namespace: &str) -> Result<()> {
        if self
            .client
            .get_database()
            .name(namespace)
            .send()
            .await
            .is_ok()
        {
            return Ok(());
        }
        let input = DatabaseInput::builder()
            .name(namespace)
            .description("Iceberg tables written by streamtable")
            .build()
            .map_err(|e| Error::Internal(format!("Glue database input: {e}")))?;
        match self
            .client
            .create_database()
            .database_input(input)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if f.code.as_deref() == Some("AlreadyExistsException") {
                    Ok(())
                } else {
                    Err(glue_error("create database", namespace, f))
                }
            }
        }
    }

    async fn list_namespaces(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .client
                .get_databases()
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| glue_error("list databases", "", SdkFault::from_sdk(&e)))?;
            out.extend(page.database_list().iter().map(|d| d.name().to_string()));
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => break,
            }
        }
        Ok(out)
    }

    async fn list_tables(&self, namespace: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .client
                .get_tables()
                .database_name(namespace)
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| glue_error("list tables", namespace, SdkFault::from_sdk(&e)))?;
            for t in page.table_list() {
                let iceberg = t
                    .parameters()
                    .and_then(|p| p.get("table_type"))
                    .is_some_and(|v| v.eq_ignore_ascii_case("ICEBERG"));
                if iceberg {
                    out.push(t.name().to_string());
                }
            }
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => break,
            }
        }
        out.sort();
        Ok(out)
    }

    async fn get(&self, namespace: &str, table: &str) -> Result<Option<Pointer>> {
        let what = format!("{namespace}.{table}");
        let out = match self
            .client
            .get_table()
            .database_name(namespace)
            .name(table)
            .send()
            .await
        {
            Ok(o) => o,
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                return if f.is_not_found() {
                    Ok(None)
                } else {
                    Err(glue_error("get table", &what, f))
                };
            }
        };
        let Some(t) = out.table() else {
            return Ok(None);
        };
        let location = t
            .parameters()
            .and_then(|p| p.get("metadata_location"))
            .ok_or_else(|| Error::State {
                op: "get table",
                message: format!(
                    "Glue table {what} has no metadata_location: it is not an Iceberg table"
                ),
                retryable: false,
            })?;
        Ok(Some(Pointer {
            metadata_location: location.clone(),
            version: t.version_id().map(str::to_string),
        }))
    }

    async fn create(
        &self,
        namespace: &str,
        table: &str,
        location: &str,
        metadata: &TableMetadata,
    ) -> Result<bool> {
        let input = table_input(table, metadata, location, None)?;
        match self
            .client
            .create_table()
            .database_name(namespace)
            .table_input(input)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => {
                if let Some(CreateTableError::AlreadyExistsException(_)) = e.as_service_error() {
                    return Ok(false);
                }
                Err(glue_error(
                    "create table",
                    &format!("{namespace}.{table}"),
                    SdkFault::from_sdk(&e),
                ))
            }
        }
    }

    async fn ensure_view(&self, namespace: &str, view: &crate::spec::ViewSpec) -> Result<()> {
        let what = format!("{namespace}.{}", view.name);
        let input = view_input(namespace, view)?;
        let existing = match self
            .client
            .get_table()
            .database_name(namespace)
            .name(&view.name)
            .send()
            .await
        {
            Ok(o) => o.table,
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if !f.is_not_found() {
                    return Err(glue_error("get view", &what, f));
                }
                None
            }
        };
        match existing {
            Some(t) if t.table_type() != Some("VIRTUAL_VIEW") => Err(Error::Config(format!(
                "Glue table {what} exists and is not a view; the windowed table {} needs the name for its view: rename or drop the table",
                view.name
            ))),
            Some(t) if t.view_original_text() == input.view_original_text() => Ok(()),
            Some(_) => self
                .client
                .update_table()
                .database_name(namespace)
                .table_input(input)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| glue_error("update view", &what, SdkFault::from_sdk(&e))),
            None => match self
                .client
                .create_table()
                .database_name(namespace)
                .table_input(input)
                .send()
                .await
            {
                Ok(_) => Ok(()),
                Err(e)
                    if matches!(
                        e.as_service_error(),
                        Some(CreateTableError::AlreadyExistsException(_))
                    ) =>
                {
                    Ok(()) // created by a concurrent run
                }
                Err(e) => Err(glue_error("create view", &what, SdkFault::from_sdk(&e))),
            },
        }
    }

    async fn swap(
        &self,
        namespace: &str,
        table: &str,
        expected: &Pointer,
        new_location: &str,
        metadata: &TableMetadata,
    ) -> Result<bool> {
        let what = format!("{namespace}.{table}");
        // Glue compares VersionId; the location check below also covers a table whose pointer
        // moved without a version (or a Glue that does not enforce it).
        match self.get(namespace, table).await? {
            Some(current) if current.metadata_location == expected.metadata_location => {}
            _ => return Ok(false),
        }
        let input = table_input(
            table,
            metadata,
            new_location,
            Some(&expected.metadata_location),
        )?;
        let mut req = self
            .client
            .update_table()
            .database_name(namespace)
            .table_input(input);
        if let Some(v) = &expected.version {
            req = req.version_id(v);
        }
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e) => {
                let mut fault = SdkFault::from_sdk(&e);
                if let Some(UpdateTableError::ConcurrentModificationException(_)) =
                    e.as_service_error()
                {
                    // Another writer, or our own earlier attempt whose answer was lost.
                    fault.retryable = true;
                }
                Err(glue_error("update table", &what, fault))
            }
        }
    }

    async fn drop_table(&self, namespace: &str, table: &str) -> Result<()> {
        self.client
            .delete_table()
            .database_name(namespace)
            .name(table)
            .send()
            .await
            .map_err(|e| {
                glue_error(
                    "delete table",
                    &format!("{namespace}.{table}"),
                    SdkFault::from_sdk(&e),
                )
            })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::view_input;
    use crate::spec::ViewSpec;

    #[test]
    fn athena_reads_the_view_in_its_own_dialect() {
        let view = ViewSpec {
            name: "buyers".into(),
            sql: "SELECT \"w\", streamtable_merge_sketches(\"c__hll\") AS \"c\" FROM buyers_partials GROUP BY \"w\"".into(),
            athena_sql: "SELECT \"w\", cardinality(merge(CAST(from_base64(\"c__hll\") AS HyperLogLog))) AS \"c\" FROM buyers_partials GROUP BY \"w\"".into(),
            columns: vec![("w".into(), "timestamp(6)".into()), ("c".into(), "bigint".into())],
        };
        let input = view_input("analytics", &view).expect("input");
        let text = input.view_original_text().expect("text");
        let encoded = text
            .strip_prefix("/* Presto View: ")
            .and_then(|t| t.strip_suffix(" */"))
            .expect("Presto view");
        let json: serde_json::Value = serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .expect("base64"),
        )
        .expect("json");
        assert_eq!(
            json["originalSql"],
            "SELECT \"w\", cardinality(merge(CAST(from_base64(\"c__hll\") AS HyperLogLog))) AS \"c\" FROM \"analytics\".\"buyers_partials\" GROUP BY \"w\""
        );
        let types: Vec<String> = input
            .storage_descriptor()
            .expect("columns")
            .columns()
            .iter()
            .filter_map(|c| c.r#type().map(str::to_string))
            .collect();
        assert_eq!(types, ["timestamp", "bigint"]);
    }
}
