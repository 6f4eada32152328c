//! What the streaming runtime refuses, and how it says so: DataFusion's planning errors with
//! their fix, plan nodes and expressions that cannot run on a stream named with the place in
//! the SQL where they are.

use crate::df::common::tree_node::{TreeNode, TreeNodeRecursion};
use crate::df::logical_expr::{Expr, LogicalPlan, Volatility};

use super::SqlError;
use super::planner::Walker;
use crate::spec::{ReferenceSpec, TableSpec};

pub(super) fn err(message: impl Into<String>, at: Option<usize>) -> SqlError {
    SqlError {
        message: message.into(),
        at,
    }
}

/// DataFusion's message, without its prefixes, with the fix for the usual mistakes.
pub(super) fn planning_error(
    message: &str,
    sql: &str,
    tables: &[TableSpec],
    references: &[ReferenceSpec],
) -> SqlError {
    let message = message
        .trim_start_matches("Error during planning: ")
        .trim_start_matches("SQL error: ")
        .trim_start_matches("Schema error: ")
        .trim()
        .to_string();
    let mut known: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
    known.extend(references.iter().map(|r| r.name.as_str()));
    let hint = if message.contains("not found") && message.contains("table") {
        format!(
            "; a derived table reads one of the topics' tables or joins a reference table: {}",
            known.join(", ")
        )
    } else if message.contains("RecursionLimitExceeded") {
        "; the parser takes parentheses, function calls and subqueries nested that deep at most: flatten the expression, or split it into several derived tables"
            .to_string()
    } else if message.contains("No field named") {
        "; name a column of the tables in FROM (qualify it as alias.column when two tables have it)"
            .to_string()
    } else {
        String::new()
    };
    let at = message
        .find("Line: ")
        .and_then(|i| locate_line_column(sql, &message[i..]));
    err(format!("{message}{hint}"), at)
}

/// `Line: 2, Column: 8` in a parser message, as a byte offset into `sql`.
fn locate_line_column(sql: &str, text: &str) -> Option<usize> {
    let mut nums = text
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().ok());
    let (line, col) = (nums.next()??, nums.next()??);
    // The parser counts lines from 1 and columns in characters.
    let mut start = 0;
    for (i, text) in sql.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            let within = text
                .char_indices()
                .nth(col.saturating_sub(1))
                .map_or(text.len(), |(b, _)| b);
            return Some(start + within);
        }
        start += text.len();
    }
    None
}

/// The byte offset in `sql` of the first of `needles` (in order of preference) it contains,
/// ignoring case.
pub(super) fn find(sql: &str, needles: &[&str]) -> Option<usize> {
    let lower = sql.to_ascii_lowercase();
    needles
        .iter()
        .find_map(|n| lower.find(&n.to_ascii_lowercase()))
}

impl Walker<'_> {
    pub(super) fn refuse(&self, construct: &str, fix: &str, needles: &[&str]) -> SqlError {
        err(
            format!("{construct} cannot run on a stream here; {fix}"),
            find(self.sql, needles),
        )
    }

    /// The message for a plan node that is not part of a supported shape.
    pub(super) fn unsupported(&self, node: &LogicalPlan) -> SqlError {
        match node {
            LogicalPlan::Aggregate(a) => {
                let name = a
                    .aggr_expr
                    .first()
                    .map(|e| e.schema_name().to_string())
                    .unwrap_or_default();
                let func = name.split('(').next().unwrap_or("").to_ascii_lowercase();
                let needle = format!("{func}(");
                let needles: Vec<&str> = if func.is_empty() {
                    vec!["group by", "group"]
                } else {
                    vec![needle.as_str(), "group by"]
                };
                self.refuse(
                    "an aggregate without a window (GROUP BY, count, sum, …)",
                    "aggregate over event-time windows, or land the rows and aggregate in the query",
                    &needles,
                )
            }
            LogicalPlan::Window(_) => self.refuse(
                "a window function (… OVER (…))",
                "it needs every row of a partition at once; compute it in the query",
                &[" over"],
            ),
            LogicalPlan::Sort(_) => self.refuse(
                "ORDER BY",
                "a stream has no order to sort by; sort in the query that reads the table",
                &["order by", "order"],
            ),
            LogicalPlan::Limit(_) => self.refuse(
                "LIMIT / OFFSET",
                "a stream has no end to count to; limit the query that reads the table",
                &["limit", "offset", "fetch"],
            ),
            LogicalPlan::Distinct(_) => self.refuse(
                "DISTINCT",
                "it needs state; deduplicate in the query, or by key within a time bound",
                &["distinct"],
            ),
            LogicalPlan::Union(_) => self.refuse(
                "UNION",
                "define one derived table per source instead",
                &["union"],
            ),
            LogicalPlan::Subquery(_) => self.subquery(),
            LogicalPlan::EmptyRelation(_) | LogicalPlan::Values(_) => err(
                "a derived table reads a topic's table: write SELECT … FROM <table>",
                None,
            ),
            LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) => self.subquery(),
            other => {
                let text = other.display().to_string();
                let what = text.split([':', ' ']).next().unwrap_or("statement");
                err(
                    format!(
                        "{what} is not a query; a derived table is one SELECT … FROM <table> [JOIN <reference table> ON …] [WHERE …]"
                    ),
                    None,
                )
            }
        }
    }

    pub(super) fn subquery(&self) -> SqlError {
        let second_select = self
            .sql
            .to_ascii_lowercase()
            .match_indices("select")
            .nth(1)
            .map(|(i, _)| i);
        err(
            "a subquery cannot run on a stream here; join the reference table instead, or define a second derived table",
            second_select,
        )
    }

    /// Refuses subqueries and functions whose value is not a function of the row alone.
    pub(super) fn check_expr(&self, expr: &Expr) -> Result<(), SqlError> {
        let mut found = None;
        let _ = expr.apply(|e| {
            match e {
                Expr::ScalarSubquery(_) | Expr::InSubquery(_) | Expr::Exists(_) => {
                    found = Some(self.subquery());
                }
                Expr::ScalarFunction(f)
                    if f.func.signature().volatility != Volatility::Immutable =>
                {
                    let name = f.func.name().to_ascii_lowercase();
                    found = Some(err(
                        format!(
                            "{name}() cannot run on a stream here: a re-delivered batch would compute another value, so the table would not be exactly once; use a column of the record (its event time, or kafka_timestamp)"
                        ),
                        find(self.sql, &[&format!("{name}(")]).or_else(|| find(self.sql, &[&name])),
                    ));
                }
                _ => {}
            }
            Ok(if found.is_some() {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        });
        found.map_or(Ok(()), Err)
    }
}
