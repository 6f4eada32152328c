//! Trino as a reader: the engine of Athena engine 3, started by `scripts/test` with
//! `scripts/trino-local --aws-endpoint <moto>` (its catalog `iceberg` reads the Glue Data Catalog
//! and S3 of the moto server). Queries go through Trino's own Python client
//! (`tests/py/trino_query.py`), answers come back in the canonical form of
//! `read_table.py --rows`, so that they compare with pyiceberg's and `streamtable query`'s.
//!
//! Trino reads Glue only: on the embedded backend (a SQLite catalog of `file://` tables) these
//! helpers answer `None`.

use std::path::Path;

use datafusion::arrow::array::{Array, StringArray};
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use streamtable::query::QueryEngine;

use super::Harness;

/// One statement's answer.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct TrinoAnswer {
    #[serde(default)]
    pub columns: Vec<String>,
    #[serde(default)]
    pub types: Vec<String>,
    #[serde(default)]
    pub rows: Vec<Vec<String>>,
    /// Trino's message when it refused the statement.
    #[serde(default)]
    pub error: Option<String>,
}

impl Harness {
    /// The Glue database of a moto harness; `None` on the embedded backend.
    pub fn glue_database(&self) -> Option<String> {
        let at = self.catalog_args.iter().position(|a| a == "--database")?;
        self.catalog_args.get(at + 1).cloned()
    }

    /// Trino's answers to `sqls`, run in this harness's Glue database (catalog `iceberg`, session
    /// in UTC); `None` on the embedded backend.
    pub fn trino(&self, sqls: &[&str]) -> Option<Vec<TrinoAnswer>> {
        let database = self.glue_database()?;
        let url = std::env::var("STREAMTABLE_TEST_TRINO").expect(
            "STREAMTABLE_TEST_TRINO is not set: the moto-backed tests read the tables back through Trino; run ./scripts/test, which starts scripts/trino-local",
        );
        let python = std::env::var("STREAMTABLE_TEST_PYTHON")
            .expect("STREAMTABLE_TEST_PYTHON is not set: run ./scripts/test");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/trino_query.py");
        let out = std::process::Command::new(python)
            .arg(script)
            .args(["--trino", &url, "--schema", &database])
            .args(sqls)
            .output()
            .expect("run trino_query.py");
        assert!(
            out.status.success(),
            "trino_query.py {sqls:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(serde_json::from_slice(&out.stdout).expect("trino_query.py prints JSON"))
    }

    /// Trino's answer to one statement, which must succeed; `None` on the embedded backend.
    pub fn trino_one(&self, sql: &str) -> Option<TrinoAnswer> {
        let answer = self.trino(&[sql])?.remove(0);
        if let Some(e) = &answer.error {
            panic!("Trino refused {sql}: {e}");
        }
        Some(answer)
    }

    /// Every row of `table` (at `snapshot`) as Trino reads it, sorted; `None` on the embedded
    /// backend.
    pub fn trino_rows(&self, table: &str, snapshot: Option<i64>) -> Option<Vec<Vec<String>>> {
        let at = snapshot.map_or(String::new(), |s| format!(" FOR VERSION AS OF {s}"));
        let mut rows = self
            .trino_one(&format!("SELECT * FROM \"{table}\"{at}"))?
            .rows;
        rows.sort();
        Some(rows)
    }

    /// On the AWS backend: Trino reads `table` (at `snapshot`) exactly as pyiceberg does, every
    /// column of every row. Nothing on the embedded backend.
    pub fn assert_trino_reads_as_pyiceberg(&self, table: &str, snapshot: Option<i64>) {
        let Some(trino) = self.trino_rows(table, snapshot) else {
            return;
        };
        let pyiceberg = self.pyiceberg_rows(table, snapshot);
        assert_eq!(
            trino.len(),
            pyiceberg.len(),
            "Trino and pyiceberg count different rows in {table} (snapshot {snapshot:?})"
        );
        assert_eq!(
            trino, pyiceberg,
            "Trino and pyiceberg disagree on {table} (snapshot {snapshot:?})"
        );
    }
}

/// `streamtable query`'s answer to `sql` in the canonical form of [`TrinoAnswer::rows`]:
/// timestamps as epoch microseconds, binary as hex, NULL as "NULL", the rest as Arrow prints it.
pub async fn query_answer(engine: &QueryEngine, sql: &str) -> Vec<Vec<String>> {
    let batches = engine
        .query(sql)
        .await
        .unwrap_or_else(|e| panic!("streamtable query {sql}: {e}"));
    let mut rows = Vec::new();
    for b in batches {
        let cols: Vec<StringArray> = b
            .columns()
            .iter()
            .map(|c| {
                use datafusion::arrow::compute::cast;
                let text = match c.data_type() {
                    DataType::Timestamp(_, _) => {
                        let us = cast(c, &DataType::Timestamp(TimeUnit::Microsecond, None))
                            .expect("to µs");
                        cast(
                            &cast(&us, &DataType::Int64).expect("to i64"),
                            &DataType::Utf8,
                        )
                    }
                    DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
                        let bin = cast(c, &DataType::Binary).expect("binary");
                        let bin = bin
                            .as_any()
                            .downcast_ref::<datafusion::arrow::array::BinaryArray>()
                            .expect("binary");
                        Ok(
                            std::sync::Arc::new(StringArray::from_iter(bin.iter().map(|v| {
                                v.map(|b| b.iter().map(|x| format!("{x:02x}")).collect::<String>())
                            }))) as _,
                        )
                    }
                    _ => cast(c, &DataType::Utf8),
                }
                .expect("to text");
                text.as_any()
                    .downcast_ref::<StringArray>()
                    .expect("strings")
                    .clone()
            })
            .collect();
        for i in 0..b.num_rows() {
            rows.push(
                cols.iter()
                    .map(|c| {
                        if c.is_null(i) {
                            "NULL".to_string()
                        } else {
                            c.value(i).to_string()
                        }
                    })
                    .collect(),
            );
        }
    }
    rows
}

/// Whether two answers' cells agree, by the column's Trino type: in the columns
/// `approximate`, numbers within `tolerance` relative (HyperLogLog estimates of two
/// implementations); `double`, `real` and `decimal` numbers equal to 1e-9 relative (a double
/// printed by two engines, a decimal against a double); anything else (integers, timestamps as
/// epoch microseconds, text) equal text. A floating value printed rounded (2 to 4 decimals,
/// as many in both) may also differ by one unit of its last decimal: `round(avg(x), 2)` of the
/// same doubles added in another order can land on either side of a half (27.525 → 27.52 or
/// 27.53).
pub fn same_cell(a: &str, b: &str, tolerance: Option<f64>, trino_type: &str) -> bool {
    if a == b {
        return true;
    }
    let floating =
        trino_type == "double" || trino_type == "real" || trino_type.starts_with("decimal");
    if tolerance.is_none() && !floating {
        return false;
    }
    let decimals = |s: &str| s.split_once('.').map_or(0, |(_, f)| f.len());
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => {
            let scale = x.abs().max(y.abs()).max(1.0);
            // Trino prints a double without its trailing zeros (`round(x, 2)` = 28.10 is
            // "28.1"): the places are the longer of the two.
            let d = decimals(a).max(decimals(b));
            let rounded = !trino_type.starts_with("decimal") && floating && (2..=4).contains(&d);
            let last_place = if rounded {
                10f64.powi(-(d as i32)) * 1.000_001
            } else {
                0.0
            };
            (x - y).abs() <= (tolerance.unwrap_or(1e-9) * scale).max(last_place)
        }
        _ => false,
    }
}

/// Asserts that Trino's `theirs` and `streamtable query`'s `ours` are the same answer to `what`,
/// row for row (in order when `ordered`, else both sorted), cells as [`same_cell`] says, with
/// the columns named in `approximate` compared within `tolerance`.
pub fn assert_same_answer(
    what: &str,
    theirs: &TrinoAnswer,
    mut ours: Vec<Vec<String>>,
    ordered: bool,
    approximate: &[(&str, f64)],
) {
    let mut trino = theirs.rows.clone();
    let approx: Vec<usize> = approximate
        .iter()
        .filter_map(|(n, _)| theirs.columns.iter().position(|c| c == n))
        .collect();
    if !ordered {
        // Sorted on the exact columns: estimates of two implementations may differ.
        let key = |r: &Vec<String>| -> Vec<String> {
            r.iter()
                .enumerate()
                .map(|(i, v)| {
                    if approx.contains(&i) {
                        String::new()
                    } else {
                        v.clone()
                    }
                })
                .collect()
        };
        trino.sort_by_key(key);
        ours.sort_by_key(key);
    }
    assert_eq!(
        trino.len(),
        ours.len(),
        "{what}: Trino returned {} rows, streamtable query {}\nTrino: {:?}\nours: {:?}",
        trino.len(),
        ours.len(),
        trino.iter().take(5).collect::<Vec<_>>(),
        ours.iter().take(5).collect::<Vec<_>>()
    );
    for (i, (t, o)) in trino.iter().zip(&ours).enumerate() {
        assert_eq!(t.len(), o.len(), "{what}: row {i} has other columns");
        for (c, (x, y)) in t.iter().zip(o).enumerate() {
            let name = theirs.columns.get(c).map_or("?", String::as_str);
            let tolerance = approximate
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| *t);
            let kind = theirs.types.get(c).map_or("", String::as_str);
            assert!(
                same_cell(x, y, tolerance, kind),
                "{what}: row {i} column {name}: Trino {x}, streamtable query {y}\nTrino row: {t:?}\nour row:   {o:?}"
            );
        }
    }
}

#[test]
fn cells_agree_only_as_their_type_allows() {
    // Timestamps (epoch µs) and integers are exact: a second or a millisecond off is wrong.
    assert!(!same_cell(
        "1795946400000000",
        "1795946401500000",
        None,
        "timestamp(6)"
    ));
    assert!(!same_cell(
        "1795946400000000",
        "1795946400001000",
        None,
        "timestamp(6)"
    ));
    assert!(!same_cell("41", "42", None, "bigint"));
    assert!(same_cell("41", "41", None, "bigint"));
    // An estimate is within its tolerance.
    assert!(same_cell("1000", "1040", Some(0.069), "bigint"));
    assert!(!same_cell("1000", "1100", Some(0.069), "bigint"));
    // Doubles: the same value printed by two engines; a rounded one off by its last decimal.
    assert!(same_cell("0.30000000000000004", "0.3", None, "double"));
    assert!(same_cell("27.52", "27.53", None, "double"));
    assert!(!same_cell("27.52", "27.54", None, "double"));
    // Rounded to 2 places on either side of a boundary, Trino dropping the trailing zero.
    assert!(same_cell("28.1", "28.11", None, "double"));
    assert!(!same_cell("28.1", "28.12", None, "double"));
    assert!(!same_cell("12.5", "12.6", None, "double"));
    assert!(!same_cell("12.3456789", "12.3456788", None, "double"));
    // Decimals are exact up to printing.
    assert!(same_cell("12.50", "12.5", None, "decimal(12,2)"));
    assert!(!same_cell("12.50", "12.51", None, "decimal(12,2)"));
    assert!(!same_cell("a", "b", None, "varchar"));
}
