//! Planning a windowed derived table: `SELECT window_start, window_end, <keys>, <aggregates>
//! FROM TABLE(TUMBLE|HOP(…)) [WHERE …] GROUP BY window_start, window_end, <keys>` becomes a
//! [`WindowPlan`]: the filter, the key and argument expressions as `PhysicalExpr`s, the
//! aggregates, and the columns of the partial rows with the view that merges them.

use std::sync::Arc;

use crate::df::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use crate::df::logical_expr::{Expr, LogicalPlan};
use crate::df::sql::parser::Statement as DFStatement;

use super::tvf::{WindowCall, blank_table_keywords, take_window};
use super::{AggPlan, Output, WindowPlan, aggregate};
use crate::SqlError;
use crate::context::SqlContext;
use crate::planner::{Walker, column_type, strip_alias};
use crate::refuse::{err, find, planning_error};
use crate::schema::TableLayout;
use crate::spec::{ColumnType, ReferenceSpec, TableSpec};

/// The table a window's rows are planned against: the source's rows with `window_start` and
/// `window_end`.
fn scan_name(source: &str) -> String {
    format!("__windowed_{source}")
}

/// Plans `sql` if it calls a window function (`Ok(None)` otherwise).
pub(crate) fn plan_window(
    ctx: &mut SqlContext,
    tables: &[TableSpec],
    references: &[ReferenceSpec],
    sql: &str,
) -> Result<Option<WindowPlan>, SqlError> {
    let Some(blanked) = blank_table_keywords(sql) else {
        return Ok(None);
    };
    let statement = ctx
        .parse(&blanked)
        .map_err(|e| planning_error(&e.to_string(), sql, tables, references))?;
    let DFStatement::Statement(mut statement) = statement else {
        return Ok(None);
    };
    let Some(call) = take_window(&mut statement, sql, scan_name)
        .map_err(|m| err(m, find(sql, &["tumble", "hop", "session", "cumulate"])))?
    else {
        return Ok(None);
    };
    let source = tables
        .iter()
        .find(|t| t.name == call.source)
        .ok_or_else(|| {
            err(
                format!(
                    "{} is not a topic's table; a window reads one of: {}",
                    call.source,
                    tables
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Some(call.at),
            )
        })?;
    let Some(event_time) = &source.event_time else {
        return Err(err(
            format!(
                "windows need event time: add watermark = \"{} - INTERVAL '30' SECOND\" to table {}",
                call.time_column, source.name
            ),
            Some(call.at),
        ));
    };
    if event_time.column != call.time_column {
        return Err(err(
            format!(
                "the window is on {}, but table {}'s event time is {} (its watermark); window on DESCRIPTOR({})",
                call.time_column, source.name, event_time.column, event_time.column
            ),
            find(sql, &["descriptor"]),
        ));
    }
    let layout = TableLayout::for_table(source).map_err(|e| err(e.to_string(), None))?;
    let mut fields: Vec<Arc<Field>> = layout.arrow_schema.fields().iter().cloned().collect();
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()));
    fields.push(Arc::new(Field::new("window_start", ts.clone(), true)));
    fields.push(Arc::new(Field::new("window_end", ts, true)));
    let widened = Arc::new(Schema::new(fields));
    ctx.register(&scan_name(&source.name), widened.clone())
        .map_err(|e| err(e.to_string(), None))?;
    let logical = ctx
        .statement_to_plan(DFStatement::Statement(statement))
        .map_err(|e| planning_error(&e.to_string(), sql, tables, references))?;
    let logical = ctx
        .analyze(logical)
        .map_err(|e| planning_error(&e.to_string(), sql, tables, references))?;
    let walker = Walker { ctx, sql, tables };
    walker.window(&logical, &call, widened).map(Some)
}

/// What an aggregate's argument type means to its accumulator: a widened column (int to
/// long, a decimal's precision) keeps it, another scale or kind does not.
fn type_class(t: &DataType) -> String {
    match t {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => "integer".into(),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => "float".into(),
        DataType::Decimal128(_, s) | DataType::Decimal256(_, s) => format!("decimal scale {s}"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Timestamp(unit, _) => format!("timestamp {unit:?}"),
        DataType::Boolean => "boolean".into(),
        other => other.to_string(),
    }
}

impl Walker<'_> {
    fn window(
        &self,
        logical: &LogicalPlan,
        call: &WindowCall,
        widened: Arc<Schema>,
    ) -> Result<WindowPlan, SqlError> {
        let LogicalPlan::Projection(projection) = logical else {
            return Err(self.unsupported(logical));
        };
        let LogicalPlan::Aggregate(aggregate) = projection.input.as_ref() else {
            return Err(match projection.input.as_ref() {
                LogicalPlan::Filter(_) => err(
                    "HAVING cannot run on a stream here; filter the windows in the query that reads the table",
                    find(self.sql, &["having"]),
                ),
                LogicalPlan::TableScan(_) | LogicalPlan::SubqueryAlias(_) => err(
                    "a window needs GROUP BY window_start, window_end[, keys] and aggregates (count, sum, min, max, avg, approx_distinct)",
                    Some(call.at),
                ),
                other => self.unsupported(other),
            });
        };
        let (filter, input) = match strip_alias(&aggregate.input) {
            LogicalPlan::Filter(f) => (Some(&f.predicate), strip_alias(&f.input)),
            other => (None, other),
        };
        if !matches!(input, LogicalPlan::TableScan(_)) {
            return Err(self.unsupported(input));
        }
        let input_df = input.schema().clone();
        let window_column = |e: &Expr| match e {
            Expr::Column(c) if c.name == "window_start" => Some(Output::WindowStart),
            Expr::Column(c) if c.name == "window_end" => Some(Output::WindowEnd),
            _ => None,
        };
        let refers_to_window = |e: &Expr| {
            e.column_refs()
                .iter()
                .any(|c| c.name == "window_start" || c.name == "window_end")
        };
        if let Some(f) = filter {
            self.check_expr(f)?;
            if refers_to_window(f) {
                return Err(err(
                    "WHERE cannot use window_start or window_end (they are assigned after the filter); filter the windows in the query that reads the table",
                    find(self.sql, &["where"]),
                ));
            }
        }
        // Group expressions: window_start and window_end, then the keys.
        let mut groups = Vec::new();
        let mut keys = Vec::new();
        let mut key_names = Vec::new();
        let (mut has_start, mut has_end) = (false, false);
        for g in &aggregate.group_expr {
            self.check_expr(g)?;
            match window_column(g) {
                Some(Output::WindowStart) => {
                    has_start = true;
                    groups.push(Output::WindowStart);
                }
                Some(_) => {
                    has_end = true;
                    groups.push(Output::WindowEnd);
                }
                None => {
                    if refers_to_window(g) {
                        return Err(err(
                            format!(
                                "GROUP BY {g}: group by window_start and window_end themselves"
                            ),
                            find(self.sql, &["group by"]),
                        ));
                    }
                    groups.push(Output::Key(keys.len()));
                    keys.push(self.physical(g, &input_df)?);
                    key_names.push(g.to_string());
                }
            }
        }
        if !(has_start && has_end) {
            return Err(err(
                "a window's GROUP BY includes window_start and window_end (as in Flink SQL): GROUP BY window_start, window_end[, keys]",
                find(self.sql, &["group by"]),
            ));
        }
        let agg_schema = aggregate.schema.clone();
        let mut aggs = Vec::new();
        for (i, a) in aggregate.aggr_expr.iter().enumerate() {
            let field = agg_schema.field(aggregate.group_expr.len() + i);
            aggs.push(self.aggregate(a, field.data_type(), &input_df)?);
        }
        let mut outputs = Vec::new();
        for (i, e) in projection.expr.iter().enumerate() {
            let name = projection.schema.field(i).name().clone();
            let mut inner = e;
            while let Expr::Alias(a) = inner {
                inner = a.expr.as_ref();
            }
            let Expr::Column(c) = inner else {
                return Err(err(
                    format!(
                        "output column {name:?} computes on aggregates (`{e}`); select the aggregates themselves and compute in the query that reads the table"
                    ),
                    find(self.sql, &[name.as_str()]),
                ));
            };
            let index = agg_schema
                .index_of_column(c)
                .map_err(|e| err(e.to_string(), None))?;
            let output = if index < groups.len() {
                groups[index]
            } else {
                Output::Agg(index - groups.len())
            };
            if !crate::spec::is_identifier(&name) {
                return Err(err(
                    format!(
                        "output column `{name}` needs a name: write `… AS some_name` (lowercase letters, digits, _)"
                    ),
                    None,
                ));
            }
            if name.starts_with("kafka_") || name.contains("__") {
                return Err(err(
                    format!(
                        "output column {name:?}: names starting kafka_ or holding __ are reserved; rename it"
                    ),
                    find(self.sql, &[name.as_str()]),
                ));
            }
            if outputs.iter().any(|(n, _, _)| n == &name) {
                return Err(err(
                    format!(
                        "output column {name:?} appears twice; rename one with `… AS other_name`"
                    ),
                    None,
                ));
            }
            let ty = match output {
                Output::WindowStart | Output::WindowEnd => ColumnType::Timestamp,
                Output::Key(_) | Output::Agg(_) => {
                    let t = agg_schema.field(index).data_type();
                    let planned = column_type(t);
                    let ty = match output {
                        Output::Agg(i) => aggs[i].func.output_type(planned),
                        _ => planned,
                    };
                    ty.ok_or_else(|| {
                        err(
                            format!("output column {name:?} is of type {t} which the table cannot hold; CAST it"),
                            find(self.sql, &[name.as_str()]),
                        )
                    })?
                }
            };
            outputs.push((name, output, ty));
        }
        for (g, out) in groups.iter().enumerate() {
            if !outputs.iter().any(|(_, o, _)| o == out) {
                return Err(err(
                    format!(
                        "GROUP BY `{}` is not in the SELECT list; select every grouping column, so that analysts see one row per window and key",
                        aggregate.group_expr[g]
                    ),
                    find(self.sql, &["group by"]),
                ));
            }
        }
        let plan = WindowPlan {
            source: call.source.clone(),
            window: call.kind,
            input_schema: widened,
            filter: filter.map(|f| self.physical(f, &input_df)).transpose()?,
            filter_text: filter.map(|f| f.to_string()),
            keys,
            key_names,
            aggs,
            outputs,
        };
        plan.partial_columns().map_err(|m| err(m, None))?;
        Ok(plan)
    }

    fn aggregate(
        &self,
        e: &Expr,
        result: &DataType,
        input: &crate::df::common::DFSchema,
    ) -> Result<AggPlan, SqlError> {
        let Expr::AggregateFunction(f) = e else {
            return Err(err(format!("`{e}` is not an aggregate"), None));
        };
        let name = f.func.name().to_ascii_lowercase();
        let at = find(self.sql, &[&format!("{name}(")]);
        let Some(func) = aggregate::by_name(&name) else {
            return Err(err(
                format!(
                    "aggregate {name}() cannot run in a window here; use {}",
                    aggregate::listed()
                ),
                at,
            ));
        };
        if f.params.distinct || f.params.filter.is_some() || !f.params.order_by.is_empty() {
            return Err(err(
                format!(
                    "{name}(DISTINCT …), FILTER and ORDER BY inside an aggregate cannot run in a window here"
                ),
                at,
            ));
        }
        let arg_text = match f.params.args.as_slice() {
            [a] if !(func.counts_rows() && matches!(a, Expr::Literal(v, _) if !v.is_null())) => {
                a.to_string()
            }
            _ => "*".to_string(),
        };
        let arg = match f.params.args.as_slice() {
            [] => None,
            [Expr::Literal(v, _)] if func.counts_rows() && !v.is_null() => None,
            [a] => {
                self.check_expr(a)?;
                if a.column_refs()
                    .iter()
                    .any(|c| c.name == "window_start" || c.name == "window_end")
                {
                    return Err(err(
                        format!("{name}() of window_start or window_end: select them instead"),
                        at,
                    ));
                }
                Some(self.physical(a, input)?)
            }
            _ => return Err(err(format!("{name}() takes one argument"), at)),
        };
        let arg_type = match &arg {
            Some(a) => a
                .data_type(input.as_arrow())
                .map_err(|e| err(e.to_string(), at))?,
            None => DataType::Int64,
        };
        if func.numeric()
            && (!arg_type.is_numeric() || matches!(arg_type, DataType::Decimal256(_, _)))
        {
            return Err(err(
                format!("{name}() of a {arg_type} value: sum and avg take numbers"),
                at,
            ));
        }
        Ok(AggPlan {
            text: format!(
                "{}({arg_text}) of {}",
                func.names()[0],
                type_class(&arg_type)
            ),
            func,
            arg,
            arg_type,
            result: result.clone(),
        })
    }
}
