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
use datafusion_sql::sqlparser::ast::{Expr as SqlExpr, Visit, Visitor};
use datafusion_sql::sqlparser::dialect::GenericDialect;

use crate::planner::MAX_EXPR_DEPTH;

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
        }
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
        if let Statement::Statement(s) = &statement
            && s.visit(&mut Depth::default()).is_break()
        {
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
        if let Some(what) = writes_files(&statement) {
            // What a session refuses when it plans it; a plan would need its file formats.
            return Err(plan_datafusion_err!(
                "{what} is not a query; a derived table is one SELECT … FROM <table> [JOIN <reference table> ON …] [WHERE …]"
            ));
        }
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

    /// The physical expression of `expr` over `schema`, its types coerced first.
    pub(crate) fn create_physical_expr(
        &self,
        expr: Expr,
        schema: &DFSchema,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let simplify = SimplifyContext::default()
            .with_schema(Arc::new(schema.clone()))
            .with_config_options(self.options.clone());
        let expr = ExprSimplifier::new(simplify).coerce(expr, schema)?;
        create_physical_expr(&expr, schema, &self.props)
    }
}

/// `COPY` (or its `EXPLAIN`): a statement that writes files, named as its plan node is.
fn writes_files(statement: &Statement) -> Option<&'static str> {
    match statement {
        Statement::CopyTo(_) => Some("CopyTo"),
        Statement::Explain(e) if matches!(e.statement.as_ref(), Statement::CopyTo(_)) => {
            Some("Explain")
        }
        _ => None,
    }
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
