//! DataFusion as the planner uses it: a SQL front end without a session or an execution
//! engine. The topics' and reference tables are schemas only, the functions are DataFusion's
//! built-in ones, and the steps are those a `SessionState` takes to plan a statement — parse,
//! resolve and plan, analyze (type coercion) — plus physical expressions for what runs on
//! batches. Linking only DataFusion's SQL, expression and function crates keeps the execution
//! engine, file formats and catalogs out of the ingest function.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion_common::arrow::datatypes::{DataType, SchemaRef};
use datafusion_common::config::ConfigOptions;
use datafusion_common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion_common::{
    DFSchema, DataFusionError, ResolvedTableReference, Result, TableReference, not_impl_err,
    plan_datafusion_err,
};
use datafusion_expr::execution_props::ExecutionProps;
use datafusion_expr::logical_plan::builder::LogicalTableSource;
use datafusion_expr::planner::{ContextProvider, ExprPlanner};
use datafusion_expr::simplify::SimplifyContext;
use datafusion_expr::{AggregateUDF, Expr, LogicalPlan, ScalarUDF, TableSource, WindowUDF};
use datafusion_optimizer::analyzer::Analyzer;
use datafusion_optimizer::simplify_expressions::ExprSimplifier;
use datafusion_physical_expr::{PhysicalExpr, create_physical_expr};
use datafusion_sql::parser::{DFParserBuilder, Statement};
use datafusion_sql::planner::{ParserOptions, SqlToRel};
use datafusion_sql::resolve::resolve_table_references;
use datafusion_sql::sqlparser::ast::{
    Expr as SqlExpr, Query, Statement as SqlStatement, Visit, Visitor, visit_relations,
};
use datafusion_sql::sqlparser::dialect::GenericDialect;

use crate::guard::{self, Limits};
use crate::planner::{MAX_EXPR_DEPTH, MAX_PLANNED_DEPTH, MAX_PLANNED_TERMS};

/// How deep the expression being visited nests; breaks past [`MAX_EXPR_DEPTH`], so the walk
/// itself never goes deeper.
#[derive(Default)]
struct Depth(usize);

impl Visitor for Depth {
    type Break = ();

    fn pre_visit_expr(&mut self, _: &SqlExpr) -> ControlFlow<()> {
        self.0 += 1;
        if self.0 > MAX_EXPR_DEPTH {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, _: &SqlExpr) -> ControlFlow<()> {
        self.0 -= 1;
        ControlFlow::Continue(())
    }
}

/// What planning takes time over, counted on the parsed SQL before it is planned: DataFusion's
/// planner takes time quadratic or worse in a statement's grouping keys, its aggregate calls
/// and its chained subscripts (`a[1:2][1:2]…`), so each is bounded where the time is still
/// well under a second; grouping sets multiply the keys and are refused outright.
#[derive(Default)]
struct Costly<'a> {
    aggregates: usize,
    names: Option<&'a HashMap<String, Arc<AggregateUDF>>>,
    refused: Option<String>,
}

impl Visitor for Costly<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        use datafusion_sql::sqlparser::ast::{GroupByExpr, SetExpr};
        let SetExpr::Select(select) = query.body.as_ref() else {
            return ControlFlow::Continue(());
        };
        if let GroupByExpr::Expressions(keys, modifiers) = &select.group_by {
            if !modifiers.is_empty()
                || keys.iter().any(|k| {
                    matches!(
                        k,
                        SqlExpr::Cube(_) | SqlExpr::Rollup(_) | SqlExpr::GroupingSets(_)
                    )
                })
            {
                self.refused = Some(
                    "GROUPING SETS, ROLLUP and CUBE cannot run on a stream; group by the window and plain keys".into(),
                );
                return ControlFlow::Break(());
            }
            if keys.len() > MAX_GROUP_KEYS {
                self.refused = Some(format!(
                    "GROUP BY has {} keys, more than the {MAX_GROUP_KEYS} a derived table may have; group by fewer keys, or split the table",
                    keys.len()
                ));
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &SqlExpr) -> ControlFlow<()> {
        match e {
            SqlExpr::CompoundFieldAccess { access_chain, .. }
                if access_chain.len() > MAX_ACCESS_CHAIN =>
            {
                self.refused = Some(format!(
                    "an expression chains {} subscripts or field accesses, more than the {MAX_ACCESS_CHAIN} a derived table may; chain fewer",
                    access_chain.len()
                ));
                ControlFlow::Break(())
            }
            SqlExpr::Function(f) => {
                let name = f
                    .name
                    .0
                    .last()
                    .and_then(|p| p.as_ident())
                    .map(|i| i.value.to_lowercase());
                if name.is_some_and(|n| self.names.is_some_and(|a| a.contains_key(&n))) {
                    self.aggregates += 1;
                    if self.aggregates > MAX_AGGREGATES {
                        self.refused = Some(format!(
                            "the SQL calls aggregate functions more than {MAX_AGGREGATES} times, the most a derived table may; split it into several tables"
                        ));
                        return ControlFlow::Break(());
                    }
                }
                ControlFlow::Continue(())
            }
            _ => ControlFlow::Continue(()),
        }
    }
}

/// The most grouping keys a statement may have (the window's columns included).
pub(crate) const MAX_GROUP_KEYS: usize = 64;

/// The most aggregate calls a statement may make.
pub(crate) const MAX_AGGREGATES: usize = 256;

/// The most subscripts and field accesses one expression may chain.
pub(crate) const MAX_ACCESS_CHAIN: usize = 16;

/// The most table reads a statement may plan, with its `WITH` queries expanded where used: a
/// query of `WITH` queries each reading the one before twice plans 2^n scans.
const MAX_TABLE_READS: usize = 64;

/// How many tables `statement` reads once each use of a `WITH` query stands for the reads of
/// its body (counted in the order the queries are defined, names compared without quotes or
/// case, so it counts too many rather than too few; capped, so it cannot overflow).
fn table_reads(statement: &SqlStatement) -> usize {
    #[derive(Default)]
    struct Ctes(HashMap<String, usize>);
    impl Ctes {
        fn reads(&self, v: &impl Visit) -> usize {
            let mut n = 0usize;
            let _ = visit_relations(v, |name| {
                let last = name.0.last().and_then(|p| p.as_ident());
                let last = last.map(|i| i.value.to_lowercase());
                let each = last.and_then(|l| self.0.get(&l).copied()).unwrap_or(1);
                n = n.saturating_add(each).min(usize::MAX / 2);
                ControlFlow::<()>::Continue(())
            });
            n
        }
    }
    impl Visitor for Ctes {
        type Break = ();
        fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
            for cte in query.with.iter().flat_map(|w| &w.cte_tables) {
                // One map for every scope: a name defined again keeps its larger count.
                let reads = self.reads(&cte.query);
                let count = self
                    .0
                    .entry(cte.alias.name.value.to_lowercase())
                    .or_default();
                *count = (*count).max(reads);
            }
            ControlFlow::Continue(())
        }
    }
    let mut ctes = Ctes::default();
    let _ = statement.visit(&mut ctes);
    ctes.reads(statement)
}

/// The catalog and schema an unqualified table name resolves to, as in a DataFusion session.
const CATALOG: &str = "datafusion";
const SCHEMA: &str = "public";

/// Tables (as schemas), DataFusion's built-in functions and its planning steps.
pub(crate) struct SqlContext {
    tables: HashMap<String, Arc<dyn TableSource>>,
    scalars: HashMap<String, Arc<ScalarUDF>>,
    aggregates: HashMap<String, Arc<AggregateUDF>>,
    windows: HashMap<String, Arc<WindowUDF>>,
    planners: Vec<Arc<dyn ExprPlanner>>,
    options: Arc<ConfigOptions>,
    props: ExecutionProps,
    /// What the physical expressions' guarded calls may make ([`crate::guard`]).
    limits: Limits,
}

impl SqlContext {
    /// A context with no tables and every built-in function a DataFusion session has.
    pub(crate) fn new() -> Self {
        let mut scalars = HashMap::new();
        let functions = datafusion_functions::all_default_functions()
            .into_iter()
            .chain(datafusion_functions_nested::all_default_nested_functions());
        for f in functions {
            for alias in f.aliases() {
                scalars.insert(alias.clone(), f.clone());
            }
            scalars.insert(f.name().to_string(), f);
        }
        let mut aggregates = HashMap::new();
        for f in datafusion_functions_aggregate::all_default_aggregate_functions() {
            for alias in f.aliases() {
                aggregates.insert(alias.clone(), f.clone());
            }
            aggregates.insert(f.name().to_string(), f);
        }
        let mut windows = HashMap::new();
        for f in datafusion_functions_window::all_default_window_functions() {
            for alias in f.aliases() {
                windows.insert(alias.clone(), f.clone());
            }
            windows.insert(f.name().to_string(), f);
        }
        // The expression planners of a DataFusion session with its default features: field
        // access (`s.field`, `s['field']`), arrays, EXTRACT, POSITION and SUBSTRING syntax, …
        let planners: Vec<Arc<dyn ExprPlanner>> = vec![
            Arc::new(datafusion_functions::core::planner::CoreFunctionPlanner::default()),
            Arc::new(datafusion_functions_nested::planner::NestedFunctionPlanner),
            Arc::new(datafusion_functions_nested::planner::FieldAccessPlanner),
            Arc::new(datafusion_functions::datetime::planner::DatetimeFunctionPlanner),
            Arc::new(datafusion_functions::unicode::planner::UnicodeFunctionPlanner),
            Arc::new(datafusion_functions_aggregate::planner::AggregateFunctionPlanner),
            Arc::new(datafusion_functions_window::planner::WindowFunctionPlanner),
        ];
        SqlContext {
            tables: HashMap::new(),
            scalars,
            aggregates,
            windows,
            planners,
            options: Arc::new(ConfigOptions::default()),
            props: ExecutionProps::new(),
            limits: Limits::default(),
        }
    }

    /// The context with `limits` for what its physical expressions' calls may make.
    pub(crate) fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Every scalar function's name (aliases included).
    pub(crate) fn function_names(&self) -> impl Iterator<Item = &str> {
        self.scalars.keys().map(String::as_str)
    }

    /// Makes table `name` (with no rows: only its schema is planned against) visible to SQL;
    /// a name already taken is refused, as a session refuses it.
    pub(crate) fn register(&mut self, name: &str, schema: SchemaRef) -> Result<()> {
        if self.tables.contains_key(name) {
            return Err(DataFusionError::Execution(format!(
                "The table {name} already exists"
            )));
        }
        self.tables
            .insert(name.to_string(), Arc::new(LogicalTableSource::new(schema)));
        Ok(())
    }

    /// Parses `sql`: exactly one statement.
    pub(crate) fn parse(&self, sql: &str) -> Result<Statement> {
        let mut statements = DFParserBuilder::new(sql)
            .with_dialect(&GenericDialect {})
            .with_recursion_limit(self.options.sql_parser.recursion_limit)
            .build()?
            .parse_statements()?;
        if statements.len() > 1 {
            return not_impl_err!("The context currently only supports a single SQL statement");
        }
        let statement = statements.pop_front().ok_or_else(|| {
            plan_datafusion_err!("No SQL statements were provided in the query string")
        })?;
        let s = match &statement {
            Statement::Statement(s) => s,
            // Refused before planning what they wrap: an `EXPLAIN` plans its statement in full.
            other => {
                let what = match other {
                    Statement::CopyTo(_) => "CopyTo",
                    Statement::Explain(_) => "Explain",
                    Statement::CreateExternalTable(_) => "CreateExternalTable",
                    _ => "This statement",
                };
                return Err(plan_datafusion_err!(
                    "{what} is not a query; a derived table is one SELECT … FROM <table> [JOIN <reference table> ON …] [WHERE …]"
                ));
            }
        };
        let reads = table_reads(s);
        if reads > MAX_TABLE_READS {
            return Err(plan_datafusion_err!(
                "the SQL reads tables {reads} times once its WITH queries are expanded, more than the {MAX_TABLE_READS} a derived table may (a WITH query used twice is read twice); read each table once"
            ));
        }
        let mut costly = Costly {
            names: Some(&self.aggregates),
            ..Costly::default()
        };
        if s.visit(&mut costly).is_break() {
            return Err(plan_datafusion_err!(
                "{}",
                costly.refused.unwrap_or_default()
            ));
        }
        if s.visit(&mut Depth::default()).is_break() {
            return Err(plan_datafusion_err!(
                "the SQL nests expressions more than {MAX_EXPR_DEPTH} levels deep (a chain such as a + b + … nests a level per term); split the expression, or move the computation into the query that reads the table"
            ));
        }
        Ok(statement)
    }

    /// The logical plan of `statement` over the registered tables. As a session does, the
    /// statement's table references are resolved first (a name error surfaces before any
    /// other) and only the tables it names are offered to the planner.
    pub(crate) fn statement_to_plan(&self, statement: Statement) -> Result<LogicalPlan> {
        let sql = &self.options.sql_parser;
        let (references, _) = resolve_table_references(&statement, sql.enable_ident_normalization)?;
        let mut tables = HashMap::with_capacity(references.len());
        for reference in references {
            let resolved = reference.resolve(CATALOG, SCHEMA);
            if resolved.catalog.as_ref() == CATALOG
                && resolved.schema.as_ref() == SCHEMA
                && let Some(t) = self.tables.get(resolved.table.as_ref())
            {
                tables.insert(resolved, t.clone());
            }
        }
        let options = ParserOptions {
            parse_float_as_decimal: sql.parse_float_as_decimal,
            enable_ident_normalization: sql.enable_ident_normalization,
            enable_options_value_normalization: sql.enable_options_value_normalization,
            support_varchar_with_length: sql.support_varchar_with_length,
            map_string_types_to_utf8view: sql.map_string_types_to_utf8view,
            collect_spans: sql.collect_spans,
            default_null_ordering: sql.default_null_ordering.as_str().into(),
        };
        let provider = Provider { cx: self, tables };
        SqlToRel::new_with_options(&provider, options).statement_to_plan(statement)
    }

    /// Parses and plans `sql`.
    pub(crate) fn create_logical_plan(&self, sql: &str) -> Result<LogicalPlan> {
        self.statement_to_plan(self.parse(sql)?)
    }

    /// The analyzed plan (types coerced, grouping functions resolved), checked.
    pub(crate) fn analyze(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        Analyzer::new().execute_and_check(plan, &self.options, |_, _| {})
    }

    /// The physical expression of `expr` over `schema`, its types coerced first, held to the
    /// planned-size limits ([`check_expanded`]), with a call whose constant arguments ask for
    /// more than a value may hold refused ([`guard::check_constants`]) and every call behind
    /// the guard ([`guard::guard`]).
    pub(crate) fn create_physical_expr(
        &self,
        expr: Expr,
        schema: &DFSchema,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let physical = self.physical_unchecked(expr, schema)?;
        check_expanded(&physical)?;
        guard::check_constants(&physical, self.limits)?;
        guard::guard(physical, self.limits, schema.as_arrow())
    }

    /// The physical expression of `expr` over `schema`, its types coerced first; not checked
    /// against the planned-size limits.
    fn physical_unchecked(&self, expr: Expr, schema: &DFSchema) -> Result<Arc<dyn PhysicalExpr>> {
        let simplify = SimplifyContext::default()
            .with_schema(Arc::new(schema.clone()))
            .with_config_options(self.options.clone());
        let expr = ExprSimplifier::new(simplify).coerce(expr, schema)?;
        create_physical_expr(&expr, schema, &self.props)
    }

    /// Refuses a plan with an expression past the limits of [`check_expanded`] once planned,
    /// for a plan that runs elsewhere: an interval join's round, which the commit stage plans
    /// and executes with DataFusion's engine. An expression this context cannot plan on its
    /// own (one reading both sides of a join) is left to the engine.
    pub(crate) fn check_plan(&self, plan: &LogicalPlan) -> Result<()> {
        plan.apply(|node| {
            let schema = match node.inputs().as_slice() {
                [input] => input.schema().clone(),
                _ => node.schema().clone(),
            };
            for e in node.expressions() {
                if let Ok(physical) = self.physical_unchecked(e, &schema) {
                    check_expanded(&physical)?;
                    guard::check_constants(&physical, self.limits)?;
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .map(|_| ())
    }
}

/// Refuses a physical expression deeper than [`MAX_PLANNED_DEPTH`] or larger than
/// [`MAX_PLANNED_TERMS`], counted as the tree evaluation walks (a shared operand once per use).
/// Planning repeats some operands — `v BETWEEN a AND b` is `v >= a AND v <= b` — so SQL within
/// [`MAX_EXPR_DEPTH`] can still plan deeper, or exponentially larger (`… BETWEEN … BETWEEN …`).
/// The walk keeps its own stack and stops at the first limit passed.
fn check_expanded(expr: &Arc<dyn PhysicalExpr>) -> Result<()> {
    let mut stack = vec![(expr, 1usize)];
    let mut terms = 0usize;
    while let Some((e, depth)) = stack.pop() {
        terms += 1;
        if depth > MAX_PLANNED_DEPTH {
            return Err(plan_datafusion_err!(
                "the SQL's expression is more than {MAX_PLANNED_DEPTH} levels deep once planned (BETWEEN and some functions repeat their operand); nest it less, or move the computation into the query that reads the table"
            ));
        }
        if terms > MAX_PLANNED_TERMS {
            return Err(plan_datafusion_err!(
                "the SQL's expression has more than {MAX_PLANNED_TERMS} terms once planned (BETWEEN and some functions repeat their operand, so nesting them doubles it); nest it less, or move the computation into the query that reads the table"
            ));
        }
        stack.extend(e.children().into_iter().map(|c| (c, depth + 1)));
    }
    Ok(())
}

/// What the SQL planner sees of a [`SqlContext`] for one statement: the tables it names.
struct Provider<'a> {
    cx: &'a SqlContext,
    tables: HashMap<ResolvedTableReference, Arc<dyn TableSource>>,
}

impl ContextProvider for Provider<'_> {
    fn get_table_source(&self, name: TableReference) -> Result<Arc<dyn TableSource>> {
        let resolved = name.resolve(CATALOG, SCHEMA);
        self.tables
            .get(&resolved)
            .cloned()
            .ok_or_else(|| plan_datafusion_err!("table '{resolved}' not found"))
    }

    fn get_table_function_source(
        &self,
        name: &str,
        _args: Vec<Expr>,
    ) -> Result<Arc<dyn TableSource>> {
        // A derived table reads topics' and reference tables only; `generate_series` and the
        // other table functions are no source of rows on a stream.
        Err(plan_datafusion_err!("table function '{name}' not found"))
    }

    fn create_cte_work_table(
        &self,
        _name: &str,
        schema: SchemaRef,
    ) -> Result<Arc<dyn TableSource>> {
        // Only planned against (a recursive query is refused once planned).
        Ok(Arc::new(LogicalTableSource::new(schema)))
    }

    fn get_expr_planners(&self) -> &[Arc<dyn ExprPlanner>] {
        &self.cx.planners
    }

    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.cx.scalars.get(name).cloned()
    }

    fn get_aggregate_meta(&self, name: &str) -> Option<Arc<AggregateUDF>> {
        self.cx.aggregates.get(name).cloned()
    }

    fn get_window_meta(&self, name: &str) -> Option<Arc<WindowUDF>> {
        self.cx.windows.get(name).cloned()
    }

    fn get_variable_type(&self, _variable_names: &[String]) -> Option<DataType> {
        None
    }

    fn options(&self) -> &ConfigOptions {
        &self.cx.options
    }

    fn udf_names(&self) -> Vec<String> {
        self.cx.scalars.keys().cloned().collect()
    }

    fn udaf_names(&self) -> Vec<String> {
        self.cx.aggregates.keys().cloned().collect()
    }

    fn udwf_names(&self) -> Vec<String> {
        self.cx.windows.keys().cloned().collect()
    }
}
