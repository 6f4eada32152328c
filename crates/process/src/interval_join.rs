//! Planning an interval join between two topics' tables:
//!
//! ```sql
//! SELECT … FROM orders o JOIN payments p
//!   ON o.order_id = p.order_id
//!  AND p.attempted_at BETWEEN o.created_at AND o.created_at + INTERVAL '1' HOUR
//! ```
//!
//! The two topics arrive through different event source mappings, so the join cannot run in
//! the ingest function; it runs in the scheduled stage over the rows each commit round lands
//! (see `commit/join/`). Here the SQL is checked and the time bound read: an inner join, equal
//! keys, and one `BETWEEN` relating the two sides' event-time columns (the columns their
//! watermarks are on), which is what lets rows be forgotten once they can no longer match.

use crate::context::SqlContext;
use crate::df::logical_expr::LogicalPlan;
use crate::df::sql::parser::Statement as DFStatement;
use crate::df::sql::sqlparser::ast::{
    BinaryOperator, Expr as SqlExpr, Ident, JoinConstraint, JoinOperator, SelectItem, SetExpr,
    Statement, TableFactor,
};

use super::SqlError;
use super::planner::column_type;
use super::refuse::{err, find, planning_error};
use crate::spec::{
    ColumnType, IntervalJoin, JOIN_KAFKA_PREFIX, JOIN_NEW_COLUMN, JoinSide, ReferenceSpec,
    TableSpec, parse_duration_ms,
};

/// An interval join, planned: how it runs, and the columns of the table it lands.
pub(crate) struct JoinPlan {
    pub join: IntervalJoin,
    pub columns: Vec<(String, ColumnType)>,
}

/// One relation of the join: the table and the name the SQL calls it by.
struct Relation<'a> {
    table: &'a TableSpec,
    alias: String,
}

/// Plans `sql` if it joins two topics' tables with a `BETWEEN` time bound (`Ok(None)`
/// otherwise: other joins are planned, or refused, as rows).
pub(crate) fn plan_join(
    ctx: &SqlContext,
    tables: &[TableSpec],
    references: &[ReferenceSpec],
    sql: &str,
) -> Result<Option<JoinPlan>, SqlError> {
    let Ok(DFStatement::Statement(mut statement)) = ctx.parse(sql) else {
        return Ok(None);
    };
    let Statement::Query(query) = statement.as_mut() else {
        return Ok(None);
    };
    let SetExpr::Select(select) = query.body.as_mut() else {
        return Ok(None);
    };
    let [from] = select.from.as_mut_slice() else {
        return Ok(None);
    };
    let relation = |f: &TableFactor| -> Option<Relation<'_>> {
        let TableFactor::Table { name, alias, .. } = f else {
            return None;
        };
        let table_name = name.to_string().trim_matches('"').to_string();
        let table = tables.iter().find(|t| t.name == table_name)?;
        Some(Relation {
            table,
            alias: alias.as_ref().map_or(table_name, |a| a.name.value.clone()),
        })
    };
    let [join] = from.joins.as_mut_slice() else {
        return Ok(None);
    };
    let (Some(left), Some(right)) = (relation(&from.relation), relation(&join.relation)) else {
        return Ok(None);
    };
    let constraint = match &mut join.join_operator {
        JoinOperator::Join(JoinConstraint::On(e)) | JoinOperator::Inner(JoinConstraint::On(e)) => e,
        _ => {
            if !has_between(sql) {
                return Ok(None);
            }
            return Err(err(
                "an interval join between two topics is an inner JOIN … ON <equal keys> AND <time> BETWEEN <other time> AND <other time> + INTERVAL …",
                find(sql, &["join"]),
            ));
        }
    };
    let mut conjuncts = Vec::new();
    split_and(constraint, &mut conjuncts);
    let Some(between) = conjuncts.iter().find_map(|c| match c {
        SqlExpr::Between {
            expr,
            negated: false,
            low,
            high,
        } => Some((expr.as_ref(), low.as_ref(), high.as_ref())),
        _ => None,
    }) else {
        return Ok(None);
    };
    let at = find(sql, &["between"]);
    let bound = Bound::read(between, &left, &right).map_err(|m| err(m, at))?;
    let mut keys = 0;
    for c in &conjuncts {
        match c {
            SqlExpr::Between { .. } => {}
            SqlExpr::BinaryOp {
                left: a,
                op: BinaryOperator::Eq,
                right: b,
            } if sides(a, &left, &right).is_some() && sides(b, &left, &right).is_some() => {
                keys += 1;
            }
            other => {
                return Err(err(
                    format!(
                        "the condition of an interval join holds equal keys and one BETWEEN; move `{other}` to WHERE"
                    ),
                    find(sql, &[&other.to_string()]),
                ));
            }
        }
    }
    if keys == 0 {
        return Err(err(
            "an interval join needs at least one equal key (ON l.id = r.id AND …)",
            find(sql, &["on"]),
        ));
    }
    for r in [&left, &right] {
        if !r.table.land {
            return Err(err(
                format!(
                    "table {} is joined but not landed; an interval join reads the rows its table lands",
                    r.table.name
                ),
                None,
            ));
        }
    }
    let side = |r: &Relation<'_>, column: &str| -> Result<JoinSide, SqlError> {
        let et = r.table.event_time.as_ref().ok_or_else(|| {
            err(
                format!(
                    "table {} has no watermark; an interval join forgets rows by event time: add watermark = \"{column} - INTERVAL '30' SECOND\" to it",
                    r.table.name
                ),
                at,
            )
        })?;
        if et.column != column {
            return Err(err(
                format!(
                    "the join's time bound is on {}.{column}, but table {}'s event time is {} (its watermark); bound the join on {}",
                    r.alias, r.table.name, et.column, et.column
                ),
                at,
            ));
        }
        Ok(JoinSide {
            table: r.table.name.clone(),
            topic: r.table.topic.clone(),
            time_column: column.to_string(),
            out_of_orderness_us: et.out_of_orderness_ms.saturating_mul(1000),
            idle_timeout_ms: et.idle_timeout_ms,
        })
    };
    let join_sides = (
        side(&left, &bound.left_column)?,
        side(&right, &bound.right_column)?,
    );
    // Output columns: the SQL planned over the two tables.
    let logical = ctx
        .create_logical_plan(sql)
        .map_err(|e| planning_error(&e.to_string(), sql, tables, references))?;
    ctx.check_plan(&logical)
        .map_err(|e| planning_error(&e.to_string(), sql, tables, references))?;
    if let Some(what) = stateful_node(&logical) {
        return Err(err(
            format!(
                "{what} over an interval join cannot run here; aggregate in the query that reads the table"
            ),
            None,
        ));
    }
    let mut columns = Vec::new();
    for f in logical.schema().fields() {
        let ty = column_type(f.data_type()).ok_or_else(|| {
            err(
                format!(
                    "output column {:?} is of type {} which the table cannot hold; CAST it",
                    f.name(),
                    f.data_type()
                ),
                find(sql, &[f.name()]),
            )
        })?;
        if columns.iter().any(|(n, _)| n == f.name()) {
            return Err(err(
                format!(
                    "output column {:?} appears twice; rename one with `… AS other_name`",
                    f.name()
                ),
                None,
            ));
        }
        columns.push((f.name().clone(), ty));
    }
    // The SQL a round runs: only pairs with at least one new row.
    let new = |alias: &str| {
        SqlExpr::CompoundIdentifier(vec![Ident::new(alias), Ident::new(JOIN_NEW_COLUMN)])
    };
    let marked = SqlExpr::BinaryOp {
        left: Box::new(constraint.clone()),
        op: BinaryOperator::And,
        right: Box::new(SqlExpr::Nested(Box::new(SqlExpr::BinaryOp {
            left: Box::new(new(&left.alias)),
            op: BinaryOperator::Or,
            right: Box::new(new(&right.alias)),
        }))),
    };
    *constraint = marked;
    // The Kafka columns of a joined row are the left row's.
    for k in crate::kafka::NAMES {
        select.projection.push(SelectItem::ExprWithAlias {
            expr: SqlExpr::CompoundIdentifier(vec![Ident::new(&left.alias), Ident::new(k)]),
            alias: Ident::new(format!("{JOIN_KAFKA_PREFIX}{k}")),
        });
    }
    Ok(Some(JoinPlan {
        join: IntervalJoin {
            left: join_sides.0,
            right: join_sides.1,
            lower_us: bound.lower_us,
            upper_us: bound.upper_us,
            sql: statement.to_string(),
        },
        columns,
    }))
}

fn has_between(sql: &str) -> bool {
    sql.to_ascii_lowercase().contains("between")
}

fn split_and<'a>(e: &'a SqlExpr, out: &mut Vec<&'a SqlExpr>) {
    match e {
        SqlExpr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            split_and(left, out);
            split_and(right, out);
        }
        SqlExpr::Nested(inner) => split_and(inner, out),
        other => out.push(other),
    }
}

/// Which side (`true`: left) a column reference `alias.column` is on, and the column.
fn sides(e: &SqlExpr, left: &Relation<'_>, right: &Relation<'_>) -> Option<(bool, String)> {
    let SqlExpr::CompoundIdentifier(parts) = e else {
        return None;
    };
    let [q, c] = parts.as_slice() else {
        return None;
    };
    if q.value == left.alias {
        Some((true, c.value.clone()))
    } else if q.value == right.alias {
        Some((false, c.value.clone()))
    } else {
        None
    }
}

/// The time bound, normalized: `right.time - left.time` within `[lower_us, upper_us]`.
struct Bound {
    left_column: String,
    right_column: String,
    lower_us: i64,
    upper_us: i64,
}

impl Bound {
    /// Reads `x BETWEEN y [± INTERVAL a] AND y [± INTERVAL b]` with x and y on different sides.
    fn read(
        (expr, low, high): (&SqlExpr, &SqlExpr, &SqlExpr),
        left: &Relation<'_>,
        right: &Relation<'_>,
    ) -> Result<Bound, String> {
        let usage =
            "write <time> BETWEEN <other side's time> AND <other side's time> + INTERVAL '1' HOUR";
        let (x_left, x_column) = sides(expr, left, right)
            .ok_or_else(|| format!("BETWEEN needs a column of one side first; {usage}"))?;
        let offset = |e: &SqlExpr| -> Result<(bool, String, i64), String> {
            match e {
                SqlExpr::BinaryOp {
                    left: a,
                    op,
                    right: b,
                } if matches!(op, BinaryOperator::Plus | BinaryOperator::Minus) => {
                    let (side, column) = sides(a, left, right)
                        .ok_or_else(|| format!("a bound of BETWEEN is the other side's time plus or minus an INTERVAL; {usage}"))?;
                    let ms = parse_duration_ms(&b.to_string())?;
                    let us = ms.saturating_mul(1000);
                    Ok((
                        side,
                        column,
                        if *op == BinaryOperator::Minus {
                            -us
                        } else {
                            us
                        },
                    ))
                }
                SqlExpr::Nested(inner) => offset_plain(inner, left, right, usage),
                other => offset_plain(other, left, right, usage),
            }
        };
        let (lo_side, lo_column, lo) = offset(low)?;
        let (hi_side, hi_column, hi) = offset(high)?;
        if lo_side != hi_side || lo_column != hi_column || lo_side == x_left {
            return Err(format!(
                "both bounds of BETWEEN are on the other side's one time column; {usage}"
            ));
        }
        if lo > hi {
            return Err("the lower bound of BETWEEN is after its upper bound".into());
        }
        // x - y in [lo, hi]; normalized to right - left.
        Ok(if x_left {
            Bound {
                left_column: x_column,
                right_column: lo_column,
                lower_us: -hi,
                upper_us: -lo,
            }
        } else {
            Bound {
                left_column: lo_column,
                right_column: x_column,
                lower_us: lo,
                upper_us: hi,
            }
        })
    }
}

fn offset_plain(
    e: &SqlExpr,
    left: &Relation<'_>,
    right: &Relation<'_>,
    usage: &str,
) -> Result<(bool, String, i64), String> {
    let (side, column) = sides(e, left, right).ok_or_else(|| {
        format!("a bound of BETWEEN is the other side's time plus or minus an INTERVAL; {usage}")
    })?;
    Ok((side, column, 0))
}

/// The first node of `plan` that would need state beyond the join's.
fn stateful_node(plan: &LogicalPlan) -> Option<&'static str> {
    let here = match plan {
        LogicalPlan::Aggregate(_) => Some("an aggregate"),
        LogicalPlan::Window(_) => Some("a window function"),
        LogicalPlan::Sort(_) => Some("ORDER BY"),
        LogicalPlan::Limit(_) => Some("LIMIT"),
        LogicalPlan::Distinct(_) => Some("DISTINCT"),
        LogicalPlan::Union(_) => Some("UNION"),
        LogicalPlan::Subquery(_) => Some("a subquery"),
        _ => None,
    };
    here.or_else(|| plan.inputs().into_iter().find_map(stateful_node))
}
