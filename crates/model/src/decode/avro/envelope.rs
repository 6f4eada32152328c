//! Debezium change events in Avro (`envelope = "debezium"`, `format = "avro"`): the envelope
//! record Debezium's AvroConverter registers (`before` and `after` of the source table's `Value`
//! record, `source`, `op`, `ts_ms`, `transaction`), read by the rules of
//! [`crate::decode::debezium`]: `c`, `u` and `r` make `after` the key's row, `d` deletes the key
//! read from `before`, anything else is refused saying why.
//!
//! The table's columns are read from `after` by their paths (`$.email` reads `after.email`);
//! `$.__op`, `$.__ts_ms` and `$.__source…` read the envelope's `op`, `ts_ms` and `source`, as in
//! JSON. Two more things are read alongside: `op`, and the key's columns in `before`.

use crate::decode::debezium::{self, Op, UNAVAILABLE};
use crate::decode::{Cell, RejectKind, Rejection};
use crate::spec::{ColumnSpec, ColumnType, JsonPath, TableSpec};

/// Where an event's parts are among the decoder's cells: first the table's columns (`width`),
/// then `op`, then the key's columns as `before` holds them.
#[derive(Debug)]
pub(super) struct Layout {
    /// How many cells the table's row has.
    width: usize,
    /// The table's cells read from `after` (not from `op`, `ts_ms` or `source`).
    after: Vec<usize>,
    /// The cell of `op`.
    op: usize,
    /// The cells of the key's columns in `before`.
    key: Vec<usize>,
}

/// What a change event asks of the table.
#[derive(Debug, PartialEq)]
pub enum AvroChange<'a> {
    /// The key's row is now these cells (one per column in spec order).
    Upsert(Vec<Cell<'a>>),
    /// The key with these cells (its columns in the primary key's order) is deleted; `None`
    /// when `before` lacks them (then the Kafka key names it).
    Delete(Option<Vec<Cell<'a>>>),
}

/// The columns the decoder reads for a Debezium `table` (paths into the envelope), and where
/// each part lands.
pub(super) fn columns(table: &TableSpec) -> (Vec<ColumnSpec>, Layout) {
    let mut leaves = table.leaves();
    let width = leaves.len();
    let mut after = Vec::new();
    for (i, c) in leaves.iter_mut().enumerate() {
        let path = &c.path.0;
        let moved = match path.first().map(String::as_str) {
            Some("__op") => vec!["op".to_string()],
            Some("__ts_ms") => vec!["ts_ms".to_string()],
            Some("__source") => [vec!["source".to_string()], path[1..].to_vec()].concat(),
            _ => {
                after.push(i);
                [vec!["after".to_string()], path.clone()].concat()
            }
        };
        c.path = JsonPath(moved);
    }
    let hidden = |name: String, path: Vec<String>, column_type| ColumnSpec {
        path: JsonPath(path),
        ..ColumnSpec::optional(&name, column_type)
    };
    let op = leaves.len();
    leaves.push(hidden("op".into(), vec!["op".into()], ColumnType::String));
    let mut key = Vec::new();
    for k in table.upsert.iter().flat_map(|u| &u.key) {
        if let Some(c) = table.columns.iter().find(|c| &c.name == k) {
            key.push(leaves.len());
            leaves.push(hidden(
                format!("before.{}", c.name),
                [vec!["before".to_string()], c.path.0.clone()].concat(),
                c.column_type,
            ));
        }
    }
    (
        leaves,
        Layout {
            width,
            after,
            op,
            key,
        },
    )
}

impl Layout {
    /// The change the decoded `cells` (every column of [`columns`]) hold, or why they are none.
    /// `required[i]` says whether the table's column `i` is required; `name(i)` names it.
    pub(super) fn change<'a>(
        &self,
        mut cells: Vec<Cell<'a>>,
        required: impl Fn(usize) -> bool,
        name: impl Fn(usize) -> String,
    ) -> Result<AvroChange<'a>, Rejection> {
        let op = match cells.get(self.op) {
            Some(Cell::Str(op)) => op.to_string(),
            _ => return Err(debezium::no_op()),
        };
        match debezium::op(&op)? {
            Op::Delete => {
                let key: Option<Vec<Cell<'a>>> = self
                    .key
                    .iter()
                    .map(|i| cells.get(*i).cloned().filter(|c| *c != Cell::Null))
                    .collect();
                Ok(AvroChange::Delete(key))
            }
            Op::Row => {
                if self
                    .after
                    .iter()
                    .all(|i| cells.get(*i).is_none_or(|c| *c == Cell::Null))
                {
                    return Err(debezium::refuse(format!(
                        "op {op:?} without an after record"
                    )));
                }
                for i in &self.after {
                    if let Some(Cell::Str(s)) = cells.get(*i)
                        && s == UNAVAILABLE
                    {
                        return Err(debezium::unavailable(&name(*i)));
                    }
                }
                cells.truncate(self.width);
                if let Some(i) = (0..cells.len()).find(|i| required(*i) && cells[*i] == Cell::Null)
                {
                    return Err(Rejection::new(
                        RejectKind::MissingField,
                        format!(
                            "required column {} is missing or null in the change event (op {op:?})",
                            name(i)
                        ),
                    ));
                }
                Ok(AvroChange::Upsert(cells))
            }
        }
    }
}
