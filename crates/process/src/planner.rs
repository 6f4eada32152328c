//! Planning a derived table's SQL with DataFusion, once: parse, resolve against the topics'
//! and reference tables' schemas, type-check, then walk the logical plan and map its shape to
//! what the streaming runtime runs — a projection, an optional filter, and an optional lookup
//! join to one reference table. Every other shape is refused with the construct named and the
//! place in the SQL where it is.

use std::sync::Arc;

use crate::df::arrow::datatypes::{DataType, SchemaRef};
use crate::df::common::{Column, DFSchema};
use crate::df::logical_expr::utils::split_conjunction;
use crate::df::logical_expr::{BinaryExpr, Expr, JoinType, LogicalPlan, Operator};
use crate::df::physical_expr::PhysicalExpr;

use super::SqlError;
use super::context::SqlContext;
use super::guard::Limits;
use super::refuse::{err, find, planning_error};
use crate::kafka;
use crate::schema::TableLayout;
use crate::spec::{ColumnType, ReferenceSpec, TableSpec};

/// A derived table's SQL, planned: what the runtime evaluates on each batch.
pub(crate) struct SqlPlan {
    /// The topic's table the SQL reads.
    pub source: String,
    /// The lookup join, if the SQL has one.
    pub lookup: Option<LookupPlan>,
    /// The schema the filter and the projection are evaluated on: the source's columns, or the
    /// join's (left side's columns, then the right side's).
    pub input_schema: SchemaRef,
    /// Where the source's columns start in `input_schema`.
    pub source_offset: usize,
    /// The `WHERE` predicate.
    pub filter: Option<Arc<dyn PhysicalExpr>>,
    /// The output columns: name, expression, and the column type the table stores.
    pub projection: Vec<(String, Arc<dyn PhysicalExpr>, ColumnType)>,
}

/// A join of the source to a reference table on equal keys.
pub(crate) struct LookupPlan {
    /// The reference table.
    pub reference: String,
    /// Whether the source is the join's left input (its columns come first).
    pub source_is_left: bool,
    /// `true` for an inner join (no row without a match), `false` for a join that keeps every
    /// source row (NULLs for the reference's columns).
    pub inner: bool,
    /// Key expressions on the source's rows.
    pub source_keys: Vec<Arc<dyn PhysicalExpr>>,
    /// Key expressions on the reference table's rows, pairwise equal to `source_keys`.
    pub reference_keys: Vec<Arc<dyn PhysicalExpr>>,
}

/// A derived table's SQL, planned: rows per batch, or windows with state.
pub(crate) enum Plan {
    /// Projection, filter, lookup join: no state.
    Rows(SqlPlan),
    /// Windows over event time, with state per partition.
    Window(super::window::WindowPlan),
    /// An interval join between two topics, run by the scheduled stage.
    Join(super::interval_join::JoinPlan),
}

impl Plan {
    /// The topic's table it reads.
    pub fn source(&self) -> &str {
        match self {
            Plan::Rows(p) => &p.source,
            Plan::Window(w) => &w.source,
            Plan::Join(j) => &j.join.left.table,
        }
    }

    /// The reference tables it joins to.
    pub fn references(&self) -> Vec<String> {
        match self {
            Plan::Rows(p) => p.lookup.iter().map(|l| l.reference.clone()).collect(),
            Plan::Window(_) | Plan::Join(_) => Vec::new(),
        }
    }

    /// The columns of the table it lands (for windows: the partial rows).
    pub fn columns(&self) -> Result<Vec<(String, ColumnType)>, SqlError> {
        match self {
            Plan::Rows(p) => Ok(p.columns()),
            Plan::Window(w) => w.partial_columns().map_err(|m| err(m, None)),
            Plan::Join(j) => Ok(j.columns.clone()),
        }
    }

    /// For windows: the view merging the partial rows, for DataFusion and for Athena.
    pub fn view_sql(&self) -> Option<(String, String)> {
        use super::window::ViewDialect;
        match self {
            Plan::Rows(_) | Plan::Join(_) => None,
            Plan::Window(w) => Some((
                w.view_sql(ViewDialect::DataFusion),
                w.view_sql(ViewDialect::Athena),
            )),
        }
    }

    /// For windows: the view's columns and their Athena types.
    pub fn view_columns(&self) -> Vec<(String, String)> {
        match self {
            Plan::Window(w) => w.view_columns(),
            _ => Vec::new(),
        }
    }

    /// For an interval join: how it runs.
    pub fn join(&self) -> Option<crate::spec::IntervalJoin> {
        match self {
            Plan::Join(j) => Some(j.join.clone()),
            _ => None,
        }
    }
}

impl SqlPlan {
    /// The columns the derived table has, in order.
    pub fn columns(&self) -> Vec<(String, ColumnType)> {
        self.projection
            .iter()
            .map(|(n, _, t)| (n.clone(), *t))
            .collect()
    }
}

/// The most bytes a derived table's SQL may have, checked before anything reads it.
pub const MAX_SQL_BYTES: usize = 1 << 20;

/// The most tokens (words, names, literals, operators) a derived table's SQL may have: it
/// bounds the planner's work. A flat list is cheap (an `IN (…)` of 30,000 values plans), so
/// the bound is generous; how deep the SQL nests is [`MAX_EXPR_DEPTH`]'s to bound.
pub const MAX_SQL_TOKENS: usize = 65_536;

/// How deep a derived table's expressions may nest: a function call and a parenthesis are a
/// level each, and a chain such as `a + b + …` nests a level per term. Planning, evaluating on a batch and
/// dropping an expression each recurse once per level, on whatever thread runs them (tokio's
/// workers have 2 MiB); an expression this deep evaluates on 2 MiB in a debug build. The
/// shipped derived tables nest under 10 levels.
pub const MAX_EXPR_DEPTH: usize = 256;

/// How deep an expression may be once planned, in the physical expressions a batch is
/// evaluated with: a little more than [`MAX_EXPR_DEPTH`], for the casts planning adds, and
/// still within what evaluation takes on 2 MiB.
pub const MAX_PLANNED_DEPTH: usize = MAX_EXPR_DEPTH + 32;

/// How many terms an expression may have once planned, counting a repeated operand once per
/// use: evaluation visits each, per batch. A flat `IN (…)` list within [`MAX_SQL_TOKENS`] fits.
pub const MAX_PLANNED_TERMS: usize = 100_000;

/// The stack planning runs on, whatever thread asks: DataFusion's passes over a statement
/// within the limits above, with room to spare.
const PLANNING_STACK_BYTES: usize = 256 << 20;

/// How long planning one statement may take before it is refused: the limits above keep every
/// statement they let through to well under a second, so a statement that takes longer has
/// found a path of DataFusion's planner they do not bound.
pub const MAX_PLANNING_SECONDS: u64 = 20;

/// Plans `sql` over the topics' `tables` and the `references`, its calls held to `limits`, on a
/// thread of its own with a stack for the largest statement the limits let through; a
/// statement past a limit is refused naming it, and so is one whose planning panics or takes
/// more than [`MAX_PLANNING_SECONDS`] (the thread is then left to finish on its own).
pub(crate) fn plan(
    tables: &[TableSpec],
    references: &[ReferenceSpec],
    sql: &str,
    limits: Limits,
) -> Result<Plan, SqlError> {
    if sql.len() > MAX_SQL_BYTES {
        return Err(err(
            format!(
                "the SQL has {} bytes, more than the {MAX_SQL_BYTES} a derived table may have; split it into several derived tables",
                sql.len()
            ),
            None,
        ));
    }
    let tokens = token_count(sql);
    if tokens > MAX_SQL_TOKENS {
        return Err(err(
            format!(
                "the SQL has {tokens} tokens, more than the {MAX_SQL_TOKENS} a derived table may have; split it into several derived tables, or move the computation into the query that reads the table"
            ),
            None,
        ));
    }
    let (tables, references, owned_sql) = (tables.to_vec(), references.to_vec(), sql.to_string());
    let (send, receive) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("sql-planner".into())
        .stack_size(PLANNING_STACK_BYTES)
        .spawn(move || {
            let planned =
                crate::guard::contain(|| plan_here(&tables, &references, &owned_sql, limits));
            // The receiver is gone when planning took too long: nothing to tell.
            let _ = send.send(planned);
        })
        .map_err(|e| {
            err(
                format!(
                    "the SQL planner could not start a thread with a {} MiB stack ({e}); give the function more memory",
                    PLANNING_STACK_BYTES >> 20
                ),
                None,
            )
        })?;
    match receive.recv_timeout(std::time::Duration::from_secs(MAX_PLANNING_SECONDS)) {
        Ok(Ok(planned)) => planned,
        Ok(Err(panic)) => Err(err(
            format!(
                "the SQL planner failed on this statement (DataFusion panicked: {panic}); simplify the SQL"
            ),
            None,
        )),
        Err(_) => Err(err(
            format!(
                "planning this statement took more than {MAX_PLANNING_SECONDS} s; simplify the SQL (fewer grouping keys, aggregates or chained subscripts), or split it into several derived tables"
            ),
            None,
        )),
    }
}

/// Tokens of `sql` as DataFusion's parser cuts them (whitespace and comments not counted); a
/// statement the tokenizer refuses counts as 0 (the parser then says why).
fn token_count(sql: &str) -> usize {
    use crate::df::sql::sqlparser::dialect::GenericDialect;
    use crate::df::sql::sqlparser::tokenizer::{Token, Tokenizer};
    Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map(|t| {
            t.iter()
                .filter(|t| !matches!(t, Token::Whitespace(_) | Token::EOF))
                .count()
        })
        .unwrap_or(0)
}

fn plan_here(
    tables: &[TableSpec],
    references: &[ReferenceSpec],
    sql: &str,
    limits: Limits,
) -> Result<Plan, SqlError> {
    let mut ctx = SqlContext::new().with_limits(limits);
    for t in tables {
        let layout = TableLayout::for_table(t).map_err(|e| err(e.to_string(), None))?;
        ctx.register(&t.name, layout.arrow_schema.clone())
            .map_err(|e| err(format!("table {}: {e}", t.name), None))?;
    }
    for r in references {
        let layout = TableLayout::for_reference(r).map_err(|e| err(e.to_string(), None))?;
        ctx.register(&r.name, super::reference::nullable(&layout))
            .map_err(|e| err(format!("table {}: {e}", r.name), None))?;
    }
    if let Some(w) = super::window::plan::plan_window(&mut ctx, tables, references, sql)? {
        return Ok(Plan::Window(w));
    }
    if let Some(j) = super::interval_join::plan_join(&ctx, tables, references, sql)? {
        return Ok(Plan::Join(j));
    }
    let logical = ctx
        .create_logical_plan(sql)
        .map_err(|e| planning_error(&e.to_string(), sql, tables, references))?;
    let logical = ctx
        .analyze(logical)
        .map_err(|e| planning_error(&e.to_string(), sql, tables, references))?;
    Walker {
        ctx: &ctx,
        sql,
        tables,
    }
    .plan(&logical)
    .map(Plan::Rows)
}

/// Walks a derived table's logical plan into what the runtime runs, or the refusal.
pub(super) struct Walker<'a> {
    pub(super) ctx: &'a SqlContext,
    pub(super) sql: &'a str,
    pub(super) tables: &'a [TableSpec],
}

impl Walker<'_> {
    fn plan(&self, logical: &LogicalPlan) -> Result<SqlPlan, SqlError> {
        let LogicalPlan::Projection(projection) = logical else {
            return Err(self.unsupported(logical));
        };
        let (filter, input) = match projection.input.as_ref() {
            LogicalPlan::Filter(f) => (Some(&f.predicate), f.input.as_ref()),
            other => (None, other),
        };
        if let LogicalPlan::Filter(f) = input {
            return Err(self.unsupported(&f.input));
        }
        for e in projection.expr.iter().chain(filter) {
            self.check_expr(e)?;
        }
        let input_df = input.schema().clone();
        let (source, lookup, source_offset) = match strip_alias(input) {
            LogicalPlan::TableScan(scan) => {
                let name = scan.table_name.table().to_string();
                self.check_source(&name)?;
                (name, None, 0)
            }
            LogicalPlan::Join(join) => self.lookup(join)?,
            other => return Err(self.unsupported(other)),
        };
        let filter = filter.map(|p| self.physical(p, &input_df)).transpose()?;
        let mut out = Vec::new();
        for (i, e) in projection.expr.iter().enumerate() {
            let field = projection.schema.field(i);
            let name = field.name().clone();
            if name.starts_with("kafka_") {
                // `SELECT *` and `o.kafka_offset` bring the source's Kafka columns, which every
                // table carries anyway; anything else under such a name is a mistake.
                if kafka::is_kafka_column(&name) && matches!(e, Expr::Column(_)) {
                    continue;
                }
                return Err(err(
                    format!(
                        "output column {name:?} is reserved: every table carries the source's {}; name it otherwise",
                        kafka::NAMES.join(", ")
                    ),
                    find(self.sql, &[name.as_str()]),
                ));
            }
            if !crate::spec::is_identifier(&name) {
                return Err(err(
                    format!(
                        "output column `{name}` needs a name: write `… AS some_name` (lowercase letters, digits, _)"
                    ),
                    None,
                ));
            }
            if out.iter().any(|(n, _, _)| n == &name) {
                return Err(err(
                    format!(
                        "output column {name:?} appears twice; rename one with `… AS other_name`"
                    ),
                    None,
                ));
            }
            let ty = column_type(field.data_type()).ok_or_else(|| {
                err(
                    format!(
                        "output column {name:?} is of type {} which the table cannot hold; CAST it to VARCHAR, INT, BIGINT, REAL, DOUBLE, BOOLEAN, DATE, TIMESTAMP or DECIMAL(P,S)",
                        field.data_type()
                    ),
                    find(self.sql, &[name.as_str()]),
                )
            })?;
            out.push((name, self.physical(e, &input_df)?, ty));
        }
        if out.is_empty() {
            return Err(err(
                "the SELECT list has no column besides the Kafka columns; select at least one",
                None,
            ));
        }
        Ok(SqlPlan {
            source,
            lookup,
            input_schema: Arc::new(input_df.as_arrow().clone()),
            source_offset,
            filter,
            projection: out,
        })
    }

    fn check_source(&self, name: &str) -> Result<(), SqlError> {
        if self.tables.iter().any(|t| t.name == name) {
            return Ok(());
        }
        Err(err(
            format!(
                "{name} is a reference table; a derived table reads a topic's table and may join reference tables to it"
            ),
            find(self.sql, &[name]),
        ))
    }

    fn lookup(
        &self,
        join: &crate::df::logical_expr::Join,
    ) -> Result<(String, Option<LookupPlan>, usize), SqlError> {
        let side = |p: &LogicalPlan| -> Result<(String, bool), SqlError> {
            match strip_alias(p) {
                LogicalPlan::TableScan(scan) => {
                    let name = scan.table_name.table().to_string();
                    let is_source = self.tables.iter().any(|t| t.name == name);
                    Ok((name, is_source))
                }
                LogicalPlan::Join(_) => Err(err(
                    "more than one join cannot run on a stream here yet; join one reference table per derived table",
                    find(self.sql, &["join"]).and_then(|first| {
                        self.sql.to_ascii_lowercase()[first + 4..]
                            .find("join")
                            .map(|i| i + first + 4)
                    }),
                )),
                other => Err(self.unsupported(other)),
            }
        };
        let (left, left_is_source) = side(&join.left)?;
        let (right, right_is_source) = side(&join.right)?;
        let (source, reference, source_is_left) = match (left_is_source, right_is_source) {
            (true, false) => (left, right, true),
            (false, true) => (right, left, false),
            (true, true) => {
                return Err(self.refuse(
                    &format!("a join between two topics' tables ({left}, {right})"),
                    "both sides move, so the join needs a time bound: add `AND r.time BETWEEN l.time AND l.time + INTERVAL '1' HOUR` on the two tables' event-time columns (an interval join), or join a topic to a reference table",
                    &["join"],
                ));
            }
            (false, false) => {
                return Err(err(
                    format!(
                        "{left} and {right} are both reference tables; a derived table reads a topic's table"
                    ),
                    find(self.sql, &["from"]),
                ));
            }
        };
        let inner = match (join.join_type, source_is_left) {
            (JoinType::Inner, _) => true,
            (JoinType::Left, true) | (JoinType::Right, false) => false,
            (t, _) => {
                return Err(self.refuse(
                    &format!("a {t} join of {source} to reference table {reference}"),
                    "keep the topic's rows with an INNER or LEFT JOIN (topic on the left)",
                    &["join"],
                ));
            }
        };
        let (source_plan, reference_plan) = if source_is_left {
            (&join.left, &join.right)
        } else {
            (&join.right, &join.left)
        };
        let mut pairs: Vec<(Expr, Expr)> = join.on.clone();
        if let Some(f) = &join.filter {
            self.check_expr(f)?;
            for conjunct in split_conjunction(f) {
                let Expr::BinaryExpr(BinaryExpr {
                    left: l,
                    op: Operator::Eq,
                    right: r,
                }) = conjunct
                else {
                    return Err(err(
                        format!(
                            "join condition `{conjunct}` is not an equality of keys; a lookup join matches on equal keys (a.k = r.k AND …) — move other conditions to WHERE"
                        ),
                        find(self.sql, &[" on "]),
                    ));
                };
                pairs.push((l.as_ref().clone(), r.as_ref().clone()));
            }
        }
        if pairs.is_empty() {
            return Err(err(
                "a join needs ON with equal keys (… ON o.key = r.key); a cross join cannot run on a stream",
                find(self.sql, &["join"]),
            ));
        }
        let on_side = |e: &Expr, p: &LogicalPlan| {
            let refs = e.column_refs();
            !refs.is_empty() && refs.iter().all(|c: &&Column| p.schema().has_column(c))
        };
        let mut source_keys = Vec::new();
        let mut reference_keys = Vec::new();
        for (a, b) in pairs {
            let (s, r) = if on_side(&a, source_plan) && on_side(&b, reference_plan) {
                (a, b)
            } else if on_side(&b, source_plan) && on_side(&a, reference_plan) {
                (b, a)
            } else {
                return Err(err(
                    format!(
                        "join condition `{a} = {b}` must compare a column of {source} with a column of {reference}"
                    ),
                    find(self.sql, &[" on "]),
                ));
            };
            source_keys.push(self.physical(&s, source_plan.schema())?);
            reference_keys.push(self.physical(&r, reference_plan.schema())?);
        }
        let source_offset = if source_is_left {
            0
        } else {
            join.left.schema().fields().len()
        };
        Ok((
            source,
            Some(LookupPlan {
                reference,
                source_is_left,
                inner,
                source_keys,
                reference_keys,
            }),
            source_offset,
        ))
    }

    pub(super) fn physical(
        &self,
        expr: &Expr,
        schema: &DFSchema,
    ) -> Result<Arc<dyn PhysicalExpr>, SqlError> {
        self.ctx
            .create_physical_expr(expr.clone(), schema)
            .map_err(|e| err(format!("expression `{expr}`: {e}"), None))
    }
}

pub(super) fn strip_alias(mut plan: &LogicalPlan) -> &LogicalPlan {
    while let LogicalPlan::SubqueryAlias(a) = plan {
        plan = a.input.as_ref();
    }
    plan
}

/// The column type a table stores for an Arrow type, if it has one.
pub(super) fn column_type(t: &DataType) -> Option<ColumnType> {
    Some(match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ColumnType::String,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::UInt8 | DataType::UInt16 => {
            ColumnType::Int
        }
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => ColumnType::Long,
        DataType::Float16 | DataType::Float32 => ColumnType::Float,
        DataType::Float64 => ColumnType::Double,
        DataType::Boolean => ColumnType::Boolean,
        DataType::Date32 | DataType::Date64 => ColumnType::Date,
        DataType::Timestamp(_, _) => ColumnType::Timestamp,
        DataType::Decimal32(p, s)
        | DataType::Decimal64(p, s)
        | DataType::Decimal128(p, s)
        | DataType::Decimal256(p, s) => {
            if *p == 0 || *p > 38 || *s < 0 || (*s as u8) > *p {
                return None;
            }
            ColumnType::Decimal {
                precision: *p,
                scale: *s as u8,
            }
        }
        _ => return None,
    })
}
