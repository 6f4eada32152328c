//! Every function a derived table calls runs behind a guard, so that no value of a record can
//! make its evaluation take down ingest. A function's arguments are weighed before it runs (the
//! functions whose result grows with an argument's value — `repeat`, `lpad`, `range`,
//! `array_repeat`, … — by what that value asks for; a function this release does not know, by
//! the size its numbers could ask for), a panic inside it is caught, and its result is weighed
//! after it ran. A call past a limit fails its batch, which the runner then evaluates row by
//! row: only the rows past the limit become dead letters of the table, the batch lands.
//!
//! The limits ([`Limits`]): a value may be at most `max_record_bytes` (a derived row larger
//! than a record the pipeline accepts is refused like the record would be); a call may ask for
//! at most [`ALLOCATION_FACTOR`] times that per row before it runs (what is asked for is an
//! upper bound, so the bound is generous and the result is weighed again); the values of one
//! call, and a table's rows of one batch, at most `max_batch_bytes`.
//!
//! `streamtable check` refuses a call whose constant arguments certainly ask for more than a
//! row may hold ([`check_constants`]), naming the function and the limit.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use std::sync::Arc;

use crate::df::arrow::array::{Array, ArrayRef, AsArray};
use crate::df::arrow::datatypes::{DataType, FieldRef};
use crate::df::common::tree_node::{Transformed, TreeNode};
use crate::df::common::{DataFusionError, Result, ScalarValue};
use crate::df::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};
use crate::df::physical_expr::expressions::Literal;
use crate::df::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

/// How many times `max_value_bytes` a call may ask for per row before it runs.
pub const ALLOCATION_FACTOR: usize = 16;

/// The default budget of one call's values, and of a table's rows of one batch.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 128 << 20;

/// What a derived table's evaluation may produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// The most bytes one value (and one derived row) may have: the spec's `max_record_bytes`.
    pub max_value_bytes: usize,
    /// The most bytes one call's values, and a table's rows of one batch, may have.
    pub max_batch_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_value_bytes: streamtable_model::spec::DEFAULT_MAX_RECORD_BYTES,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
        }
    }
}

impl Limits {
    /// The limits of a pipeline whose records are at most `max_record_bytes`.
    pub fn for_records(max_record_bytes: usize) -> Limits {
        Limits {
            max_value_bytes: max_record_bytes.max(1),
            ..Limits::default()
        }
    }

    /// What a call may ask for per row before it runs.
    fn per_row_allocation(&self) -> f64 {
        self.max_value_bytes.saturating_mul(ALLOCATION_FACTOR) as f64
    }
}

/// How a function's result grows with its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Growth {
    /// At most about the size of its arguments, whatever their values (the result is still
    /// weighed after the call).
    Bounded,
    /// `repeat(s, n)`: `n` times the text.
    Repeat,
    /// `lpad(s, n [, fill])`, `rpad`: `n` characters.
    Pad,
    /// `range(start, stop [, step])`, `generate_series`: an element per step.
    Series,
    /// `array_repeat(v, n)`: `n` copies of the value.
    ArrayRepeat,
    /// `array_resize(a, n [, v])`: `n` elements.
    ArrayResize,
    /// `replace(s, from, to)`: each match of `from` in `s` becomes `to`.
    Replace,
    /// `regexp_replace(s, pattern, to [, flags])`, `array_replace_all(a, from, to)`,
    /// `array_to_string(a, sep [, null])`: up to one copy of the later arguments per byte of
    /// the first.
    Product,
    /// `levenshtein(a, b)`: work of the product of its arguments' lengths (weighed as bytes).
    Quadratic,
    /// A function this release does not know: its numbers may ask for as many bytes each.
    Unknown,
}

/// The functions of DataFusion's registry whose result grows with an argument's value, by
/// name (aliases included); [`BOUNDED`] lists those whose result does not.
const GROWING: &[(&str, Growth)] = &[
    ("repeat", Growth::Repeat),
    ("lpad", Growth::Pad),
    ("rpad", Growth::Pad),
    ("range", Growth::Series),
    ("generate_series", Growth::Series),
    ("array_repeat", Growth::ArrayRepeat),
    ("list_repeat", Growth::ArrayRepeat),
    ("array_resize", Growth::ArrayResize),
    ("list_resize", Growth::ArrayResize),
    ("replace", Growth::Replace),
    ("regexp_replace", Growth::Product),
    ("array_replace_all", Growth::Product),
    ("list_replace_all", Growth::Product),
    ("array_replace_n", Growth::Product),
    ("list_replace_n", Growth::Product),
    ("array_replace", Growth::Product),
    ("list_replace", Growth::Product),
    ("array_to_string", Growth::Product),
    ("list_to_string", Growth::Product),
    ("array_join", Growth::Product),
    ("list_join", Growth::Product),
    ("levenshtein", Growth::Quadratic),
];

/// The functions of DataFusion's registry whose result is at most about the size of their
/// arguments, whatever their values (a test checks that every function of the registry is in
/// one list or the other, so that a new release's functions are classified, not guessed).
const BOUNDED: &[&str] = &[
    // Math: a number in, a number out.
    "abs",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "cbrt",
    "ceil",
    "cos",
    "cosh",
    "cot",
    "degrees",
    "exp",
    "factorial",
    "floor",
    "gcd",
    "isnan",
    "iszero",
    "lcm",
    "ln",
    "log",
    "log10",
    "log2",
    "nanvl",
    "pi",
    "pow",
    "power",
    "radians",
    "random",
    "round",
    "signum",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
    // Text: each at most a constant times its arguments.
    "ascii",
    "bit_length",
    "btrim",
    "char_length",
    "character_length",
    "chr",
    "concat",
    "concat_ws",
    "contains",
    "ends_with",
    "find_in_set",
    "initcap",
    "instr",
    "left",
    "length",
    "levenshtein",
    "lower",
    "ltrim",
    "octet_length",
    "overlay",
    "position",
    "reverse",
    "right",
    "rtrim",
    "split_part",
    "starts_with",
    "strpos",
    "substr",
    "substr_index",
    "substring",
    "substring_index",
    "to_hex",
    "translate",
    "trim",
    "upper",
    "uuid",
    "regexp_count",
    "regexp_instr",
    "regexp_like",
    "regexp_match",
    "string_to_array",
    "string_to_list",
    "to_char",
    "date_format",
    "encode",
    "decode",
    "md5",
    "sha224",
    "sha256",
    "sha384",
    "sha512",
    "digest",
    "byte_length",
    "greatest",
    "least",
    // Dates and times.
    "current_date",
    "current_time",
    "current_timestamp",
    "now",
    "today",
    "date_bin",
    "date_part",
    "datepart",
    "date_trunc",
    "datetrunc",
    "from_unixtime",
    "make_date",
    "make_time",
    "to_date",
    "to_local_time",
    "to_time",
    "to_timestamp",
    "to_timestamp_micros",
    "to_timestamp_millis",
    "to_timestamp_nanos",
    "to_timestamp_seconds",
    "to_unixtime",
    "extract",
    // Core.
    "arrow_cast",
    "arrow_metadata",
    "arrow_typeof",
    "coalesce",
    "get_field",
    "ifnull",
    "named_struct",
    "nullif",
    "nvl",
    "nvl2",
    "overlay",
    "struct",
    "row",
    "union_extract",
    "union_tag",
    "version",
    "arrow_try_cast",
    "try_cast",
    // Arrays and maps: elements moved, picked or counted, never multiplied by a value.
    "array_any_value",
    "list_any_value",
    "array_append",
    "list_append",
    "array_push_back",
    "list_push_back",
    "array_prepend",
    "list_prepend",
    "array_push_front",
    "list_push_front",
    "array_concat",
    "array_cat",
    "list_concat",
    "list_cat",
    "array_contains",
    "array_has",
    "list_has",
    "list_contains",
    "array_has_all",
    "list_has_all",
    "array_has_any",
    "list_has_any",
    "arrays_overlap",
    "array_dims",
    "list_dims",
    "array_distinct",
    "list_distinct",
    "array_element",
    "array_extract",
    "list_element",
    "list_extract",
    "array_empty",
    "list_empty",
    "empty",
    "array_except",
    "list_except",
    "array_intersect",
    "list_intersect",
    "array_union",
    "list_union",
    "array_length",
    "list_length",
    "array_ndims",
    "list_ndims",
    "array_pop_back",
    "list_pop_back",
    "array_pop_front",
    "list_pop_front",
    "array_position",
    "list_position",
    "array_indexof",
    "list_indexof",
    "array_positions",
    "list_positions",
    "array_remove",
    "list_remove",
    "array_remove_n",
    "list_remove_n",
    "array_remove_all",
    "list_remove_all",
    "array_reverse",
    "list_reverse",
    "array_slice",
    "list_slice",
    "array_sort",
    "list_sort",
    "array_distance",
    "list_distance",
    "array_max",
    "list_max",
    "array_min",
    "list_min",
    "cardinality",
    "flatten",
    "make_array",
    "make_list",
    "map",
    "map_extract",
    "map_keys",
    "map_values",
    "element_at",
    "map_entries",
    "array_has_all",
    "arrays_zip",
    "list_zip",
];

/// How function `name`'s result grows.
pub(crate) fn growth(name: &str) -> Growth {
    if let Some((_, g)) = GROWING.iter().find(|(n, _)| *n == name) {
        return *g;
    }
    if BOUNDED.contains(&name) {
        Growth::Bounded
    } else {
        Growth::Unknown
    }
}

/// Whether values of `t` vary in size (text, binary, nested): what an operator can grow.
fn variable_size(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::List(_)
            | DataType::LargeList(_)
            | DataType::ListView(_)
            | DataType::LargeListView(_)
            | DataType::FixedSizeList(_, _)
            | DataType::Struct(_)
            | DataType::Map(_, _)
            | DataType::Dictionary(_, _)
    )
}

/// `expr` (over `schema`) with every function call behind a guard, and every other node that
/// makes values of varying size (`a || b`, CASE, casts to text, …) weighed after it runs.
pub(crate) fn guard(
    expr: Arc<dyn PhysicalExpr>,
    limits: Limits,
    schema: &crate::df::arrow::datatypes::Schema,
) -> Result<Arc<dyn PhysicalExpr>> {
    use crate::df::physical_expr::expressions::Column;
    expr.transform_up(|e| {
        let Some(call) = e.as_any().downcast_ref::<ScalarFunctionExpr>() else {
            let leaf = e.as_any().is::<Column>()
                || e.as_any().is::<Literal>()
                || e.as_any().is::<Weighed>();
            if leaf || !e.data_type(schema).is_ok_and(|t| variable_size(&t)) {
                return Ok(Transformed::no(e));
            }
            return Ok(Transformed::yes(
                Arc::new(Weighed { inner: e, limits }) as Arc<dyn PhysicalExpr>
            ));
        };
        if call.fun().inner().as_any().is::<Guarded>() {
            return Ok(Transformed::no(e));
        }
        let inner = Arc::new(call.fun().clone());
        let guarded = ScalarUDF::new_from_impl(Guarded {
            growth: growth(inner.name()),
            inner,
            limits,
        });
        Ok(Transformed::yes(Arc::new(ScalarFunctionExpr::new(
            call.name(),
            Arc::new(guarded),
            call.args().to_vec(),
            call.return_field(&crate::df::arrow::datatypes::Schema::empty())?,
            Arc::new(call.config_options().clone()),
        )) as Arc<dyn PhysicalExpr>))
    })
    .map(|t| t.data)
}

/// `functions` (a DataFusion session's) behind the guard, to register in place of them: what
/// the commit stage's interval joins run their SQL with, so that a record's values cannot make
/// a call allocate without bound there either (the round then fails, naming the call, and the
/// join's other rounds are deferred rather than the scheduled stage aborted).
pub fn guarded_functions(
    functions: impl IntoIterator<Item = Arc<ScalarUDF>>,
    limits: Limits,
) -> Vec<ScalarUDF> {
    functions
        .into_iter()
        .filter(|f| !f.inner().as_any().is::<Guarded>())
        .map(|inner| {
            ScalarUDF::new_from_impl(Guarded {
                growth: growth(inner.name()),
                inner,
                limits,
            })
        })
        .collect()
}

/// Refuses a call in `expr` whose constant arguments certainly ask for more than a value may
/// hold (`repeat(x, 100000000)`), naming it: what `streamtable check` says before a batch meets
/// it. Arguments that are not constants count as one byte.
pub(crate) fn check_constants(expr: &Arc<dyn PhysicalExpr>, limits: Limits) -> Result<()> {
    expr.apply(|e| {
        if let Some(call) = e.as_any().downcast_ref::<ScalarFunctionExpr>() {
            let name = call.fun().inner().as_any().downcast_ref::<Guarded>().map_or_else(
                || call.name().to_string(),
                |g| g.inner.name().to_string(),
            );
            let g = growth(&name);
            if !matches!(g, Growth::Bounded | Growth::Quadratic) {
                let args: Vec<Arg> = call
                    .args()
                    .iter()
                    .map(|a| match a.as_any().downcast_ref::<Literal>() {
                        Some(l) => Arg::of_scalar(l.value()),
                        None => Arg {
                            bytes: 1.0,
                            ..Arg::default()
                        },
                    })
                    .collect();
                let any_constant = call
                    .args()
                    .iter()
                    .any(|a| a.as_any().downcast_ref::<Literal>().is_some());
                let asked = estimate(g, &args);
                if any_constant && asked > limits.max_value_bytes as f64 {
                    return Err(DataFusionError::Plan(format!(
                        "{name}(…) with these constant arguments makes values of about {} each, more than the {} a value may have (max_record_bytes); use smaller arguments",
                        human_bytes(asked),
                        limits.max_value_bytes
                    )));
                }
            }
        }
        Ok(crate::df::common::tree_node::TreeNodeRecursion::Continue)
    })
    .map(|_| ())
}

/// An operator whose values vary in size, weighed after it runs (a panic in it caught).
#[derive(Debug)]
struct Weighed {
    inner: Arc<dyn PhysicalExpr>,
    limits: Limits,
}

impl PartialEq for Weighed {
    fn eq(&self, other: &Self) -> bool {
        self.limits == other.limits && self.inner.as_ref() == other.inner.as_ref()
    }
}

impl Eq for Weighed {}

impl std::hash::Hash for Weighed {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.as_ref().hash(state);
        self.limits.hash(state);
    }
}

impl std::fmt::Display for Weighed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl PhysicalExpr for Weighed {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn data_type(&self, input_schema: &crate::df::arrow::datatypes::Schema) -> Result<DataType> {
        self.inner.data_type(input_schema)
    }

    fn nullable(&self, input_schema: &crate::df::arrow::datatypes::Schema) -> Result<bool> {
        self.inner.nullable(input_schema)
    }

    fn return_field(&self, input_schema: &crate::df::arrow::datatypes::Schema) -> Result<FieldRef> {
        self.inner.return_field(input_schema)
    }

    fn evaluate(&self, batch: &crate::df::arrow::array::RecordBatch) -> Result<ColumnarValue> {
        let out = contain(|| self.inner.evaluate(batch)).map_err(|panic| {
            DataFusionError::Execution(format!("`{}` failed on this value ({panic})", self.inner))
        })??;
        weigh(
            &format!("`{}`", self.inner),
            &out,
            batch.num_rows(),
            self.limits,
        )?;
        Ok(out)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.inner.children()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(Arc::new(Weighed {
            inner: Arc::clone(&self.inner).with_new_children(children)?,
            limits: self.limits,
        }))
    }

    fn fmt_sql(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt_sql(f)
    }
}

/// A function call behind the guard.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Guarded {
    inner: Arc<ScalarUDF>,
    growth: Growth,
    limits: Limits,
}

impl ScalarUDFImpl for Guarded {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = self.inner.name();
        let rows = args.number_rows;
        {
            let (most, total) = asked(self.growth, &args.args, rows);
            if self.growth == Growth::Quadratic {
                // Work, not bytes: at most max_record_bytes steps a row, and the batch's calls
                // (row by row included) share max_batch_bytes steps.
                let per_row = self.limits.max_value_bytes as f64;
                if most > per_row {
                    return Err(DataFusionError::Execution(format!(
                        "{name}(…) would take about {most:.1e} steps on this value (the product of its arguments' lengths), more than the {per_row:.1e} a row may take (max_record_bytes)"
                    )));
                }
                if !spend_work(total, self.limits.max_batch_bytes as f64) {
                    return Err(DataFusionError::Execution(format!(
                        "{name}(…) on this batch would take more than the {:.1e} steps a batch may take (max_batch_bytes)",
                        self.limits.max_batch_bytes as f64
                    )));
                }
            }
            if most > self.limits.per_row_allocation() {
                return Err(DataFusionError::Execution(format!(
                    "{name}(…) would make a value of about {}, more than the {} a value may have (max_record_bytes)",
                    human_bytes(most),
                    self.limits.max_value_bytes
                )));
            }
            if self.growth != Growth::Quadratic && total > self.limits.max_batch_bytes as f64 {
                return Err(DataFusionError::Execution(format!(
                    "{name}(…) would make about {} for {rows} rows, more than the {} a call may make",
                    human_bytes(total),
                    self.limits.max_batch_bytes
                )));
            }
        }
        let out = contain(|| self.inner.invoke_with_args(args)).map_err(|panic| {
            DataFusionError::Execution(format!("{name}(…) failed on this value ({panic})"))
        })??;
        weigh(name, &out, rows, self.limits)?;
        Ok(out)
    }
}

thread_local! {
    /// How many [`contain`] calls this thread is inside: a panic there is caught and reported
    /// by the caller, not printed.
    static CONTAINED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// Work (steps) the quadratic calls of this thread's current batch have taken.
    static WORK: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// Starts a batch's evaluation on this thread: its quadratic calls share one budget of work,
/// whether the batch is evaluated whole or row by row.
pub(crate) fn start_batch() {
    WORK.with(|w| w.set(0.0));
}

/// Takes `steps` of work from the batch's budget of `budget`; `false` when it is spent.
fn spend_work(steps: f64, budget: f64) -> bool {
    WORK.with(|w| {
        let next = w.get() + steps;
        if next > budget {
            return false;
        }
        w.set(next);
        true
    })
}

/// Installs, once, a panic hook that stays quiet inside [`contain`] and otherwise does what
/// the hook before it did.
fn quiet_hook() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CONTAINED.with(|c| c.get()) == 0 {
                before(info);
            }
        }));
    });
}

/// Runs `f`, catching a panic (returned as its message) without printing it: a derived
/// table's evaluation, whose failure becomes dead letters naming the message.
pub(crate) fn contain<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    quiet_hook();
    CONTAINED.with(|c| c.set(c.get().saturating_add(1)));
    let out = catch_unwind(AssertUnwindSafe(f));
    CONTAINED.with(|c| c.set(c.get().saturating_sub(1)));
    out.map_err(|panic| panic_message(panic.as_ref()))
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic".to_string()
    }
}

/// Refuses `out` (a call's result for `rows` rows) with a value over the value limit, or in all
/// over the batch limit.
fn weigh(name: &str, out: &ColumnarValue, rows: usize, limits: Limits) -> Result<()> {
    let name = if name.len() > 80 {
        format!("{}…", name.chars().take(80).collect::<String>())
    } else {
        name.to_string()
    };
    let (most, total) = match out {
        ColumnarValue::Scalar(s) => {
            let b = scalar_bytes(s);
            (b, b.saturating_mul(rows.max(1)))
        }
        ColumnarValue::Array(a) => {
            let sizes = value_sizes(a.as_ref());
            (
                sizes.iter().copied().max().unwrap_or(0),
                sizes.iter().fold(0usize, |n, s| n.saturating_add(*s)),
            )
        }
    };
    if most > limits.max_value_bytes {
        return Err(DataFusionError::Execution(format!(
            "{name}(…) made a value of {most} bytes, more than the {} a value may have (max_record_bytes)",
            limits.max_value_bytes
        )));
    }
    if total > limits.max_batch_bytes {
        return Err(DataFusionError::Execution(format!(
            "{name}(…) made {total} bytes for {rows} rows, more than the {} a call may make",
            limits.max_batch_bytes
        )));
    }
    Ok(())
}

/// A bytes count for messages: `1.2 GB`.
fn human_bytes(b: f64) -> String {
    if b >= 1e18 {
        return format!("{b:.1e}");
    }
    let units = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")];
    for (size, unit) in units {
        if b >= size {
            return format!("{:.1} {unit}", b / size);
        }
    }
    format!("{b:.0} bytes")
}

/// One argument of one row as the estimates see it.
#[derive(Debug, Clone, Copy, Default)]
struct Arg {
    /// Its size in bytes.
    bytes: f64,
    /// Its magnitude, if a number (else 0).
    number: f64,
    /// Its value with its sign, if a number (else 0).
    signed: f64,
    /// As an instant or a duration in nanoseconds, if a date, time, timestamp or interval.
    instant: Option<f64>,
}

impl Arg {
    fn of_scalar(s: &ScalarValue) -> Arg {
        if s.is_null() {
            return Arg::default();
        }
        match s.to_array_of_size(1) {
            Ok(a) => Arg::of_array(a.as_ref(), 0, scalar_bytes(s) as f64),
            Err(_) => Arg {
                bytes: scalar_bytes(s) as f64,
                ..Arg::default()
            },
        }
    }

    fn of_array(a: &dyn Array, i: usize, bytes: f64) -> Arg {
        if a.is_null(i) {
            return Arg::default();
        }
        let signed = number_at(a, i).unwrap_or(0.0);
        Arg {
            bytes,
            number: signed.abs(),
            signed,
            instant: instant_at(a, i),
        }
    }
}

/// The most a call of `growth` asks for in a row, and in all, for arguments `args`.
fn asked(growth: Growth, args: &[ColumnarValue], rows: usize) -> (f64, f64) {
    let sizes: Vec<Option<Vec<usize>>> = args
        .iter()
        .map(|a| match a {
            ColumnarValue::Array(a) => Some(value_sizes(a.as_ref())),
            ColumnarValue::Scalar(_) => None,
        })
        .collect();
    let scalars: Vec<Option<Arg>> = args
        .iter()
        .map(|a| match a {
            ColumnarValue::Scalar(s) => Some(Arg::of_scalar(s)),
            ColumnarValue::Array(_) => None,
        })
        .collect();
    let all_scalar = scalars.iter().all(Option::is_some);
    let n = if all_scalar { 1 } else { rows };
    let (mut most, mut total) = (0f64, 0f64);
    let mut row: Vec<Arg> = Vec::with_capacity(args.len());
    for i in 0..n {
        row.clear();
        for (k, a) in args.iter().enumerate() {
            row.push(match (a, &scalars[k], &sizes[k]) {
                (_, Some(s), _) => *s,
                (ColumnarValue::Array(a), None, Some(sz)) => {
                    Arg::of_array(a.as_ref(), i, sz.get(i).copied().unwrap_or(0) as f64)
                }
                _ => Arg::default(),
            });
        }
        let e = estimate(growth, &row);
        most = most.max(e);
        total += e;
    }
    if all_scalar {
        total *= rows.max(1) as f64;
    }
    (most, total)
}

/// What a call of `growth` asks for, in bytes, for one row's arguments.
fn estimate(growth: Growth, args: &[Arg]) -> f64 {
    let arg = |k: usize| args.get(k).copied().unwrap_or_default();
    let bytes: f64 = args.iter().map(|a| a.bytes).sum();
    match growth {
        // At most about its arguments (a few times, for text re-encoded): what it is given.
        Growth::Bounded => bytes,
        Growth::Quadratic => arg(0).bytes.max(1.0) * arg(1).bytes.max(1.0),
        Growth::Repeat => arg(1).number * arg(0).bytes.max(1.0),
        // A character is at most 4 bytes.
        Growth::Pad => arg(1).number * 4.0 + arg(0).bytes,
        Growth::Series => {
            let (start, stop, step) = match args.len() {
                0 => return 0.0,
                1 => (Arg::default(), arg(0), None),
                2 => (arg(0), arg(1), None),
                _ => (arg(0), arg(1), Some(arg(2))),
            };
            let count = match (start.instant, stop.instant) {
                (Some(a), Some(b)) => {
                    let step = step.and_then(|s| s.instant).unwrap_or(1.0).abs().max(1.0);
                    (b - a).abs() / step
                }
                _ => {
                    let step = step.map_or(1.0, |s| s.number).max(1.0);
                    (stop.signed - start.signed).abs() / step
                }
            };
            (count + 1.0) * 8.0
        }
        Growth::ArrayRepeat => arg(1).number * (arg(0).bytes + 8.0),
        Growth::ArrayResize => arg(1).number * (arg(2).bytes + 16.0) + arg(0).bytes,
        Growth::Replace => {
            let (s, from, to) = (arg(0).bytes, arg(1).bytes.max(1.0), arg(2).bytes);
            s + (s / from + 1.0) * to
        }
        Growth::Product => {
            let first = arg(0).bytes;
            let rest: f64 = args.iter().skip(1).map(|a| a.bytes).sum();
            first + (first + 1.0) * rest
        }
        Growth::Unknown => {
            let numbers: f64 = args.iter().map(|a| a.number).sum();
            (numbers + 1.0) * (bytes + 16.0)
        }
    }
}

/// Row `i` of `a` as a number, if it is one.
fn number_at(a: &dyn Array, i: usize) -> Option<f64> {
    use crate::df::arrow::datatypes::*;
    Some(match a.data_type() {
        DataType::Int8 => f64::from(a.as_primitive::<Int8Type>().value(i)),
        DataType::Int16 => f64::from(a.as_primitive::<Int16Type>().value(i)),
        DataType::Int32 => f64::from(a.as_primitive::<Int32Type>().value(i)),
        DataType::Int64 => a.as_primitive::<Int64Type>().value(i) as f64,
        DataType::UInt8 => f64::from(a.as_primitive::<UInt8Type>().value(i)),
        DataType::UInt16 => f64::from(a.as_primitive::<UInt16Type>().value(i)),
        DataType::UInt32 => f64::from(a.as_primitive::<UInt32Type>().value(i)),
        DataType::UInt64 => a.as_primitive::<UInt64Type>().value(i) as f64,
        DataType::Float16 => f64::from(a.as_primitive::<Float16Type>().value(i)),
        DataType::Float32 => f64::from(a.as_primitive::<Float32Type>().value(i)),
        DataType::Float64 => a.as_primitive::<Float64Type>().value(i),
        DataType::Decimal32(_, s) => {
            f64::from(a.as_primitive::<Decimal32Type>().value(i)) / 10f64.powi(i32::from(*s))
        }
        DataType::Decimal64(_, s) => {
            a.as_primitive::<Decimal64Type>().value(i) as f64 / 10f64.powi(i32::from(*s))
        }
        DataType::Decimal128(_, s) => {
            a.as_primitive::<Decimal128Type>().value(i) as f64 / 10f64.powi(i32::from(*s))
        }
        DataType::Decimal256(_, s) => {
            let v = a.as_primitive::<Decimal256Type>().value(i);
            v.to_string().parse::<f64>().ok()? / 10f64.powi(i32::from(*s))
        }
        _ => return None,
    })
    .filter(|v| !v.is_nan())
}

/// Row `i` of `a` as nanoseconds since the epoch (dates, times, timestamps) or as a duration in
/// nanoseconds (intervals, durations), if it is one of those.
fn instant_at(a: &dyn Array, i: usize) -> Option<f64> {
    use crate::df::arrow::datatypes::*;
    const DAY_NS: f64 = 86_400e9;
    let unit = |u: &TimeUnit| match u {
        TimeUnit::Second => 1e9,
        TimeUnit::Millisecond => 1e6,
        TimeUnit::Microsecond => 1e3,
        TimeUnit::Nanosecond => 1.0,
    };
    Some(match a.data_type() {
        DataType::Date32 => f64::from(a.as_primitive::<Date32Type>().value(i)) * DAY_NS,
        DataType::Date64 => a.as_primitive::<Date64Type>().value(i) as f64 * 1e6,
        DataType::Timestamp(u, _) => {
            let v = match u {
                TimeUnit::Second => a.as_primitive::<TimestampSecondType>().value(i),
                TimeUnit::Millisecond => a.as_primitive::<TimestampMillisecondType>().value(i),
                TimeUnit::Microsecond => a.as_primitive::<TimestampMicrosecondType>().value(i),
                TimeUnit::Nanosecond => a.as_primitive::<TimestampNanosecondType>().value(i),
            };
            v as f64 * unit(u)
        }
        DataType::Duration(u) => {
            let v = match u {
                TimeUnit::Second => a.as_primitive::<DurationSecondType>().value(i),
                TimeUnit::Millisecond => a.as_primitive::<DurationMillisecondType>().value(i),
                TimeUnit::Microsecond => a.as_primitive::<DurationMicrosecondType>().value(i),
                TimeUnit::Nanosecond => a.as_primitive::<DurationNanosecondType>().value(i),
            };
            v as f64 * unit(u)
        }
        DataType::Interval(IntervalUnit::YearMonth) => {
            f64::from(a.as_primitive::<IntervalYearMonthType>().value(i)) * 28.0 * DAY_NS
        }
        DataType::Interval(IntervalUnit::DayTime) => {
            let v = a.as_primitive::<IntervalDayTimeType>().value(i);
            f64::from(v.days) * DAY_NS + f64::from(v.milliseconds) * 1e6
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let v = a.as_primitive::<IntervalMonthDayNanoType>().value(i);
            // A month is at least 28 days: the fewest nanoseconds a step can take.
            f64::from(v.months) * 28.0 * DAY_NS + f64::from(v.days) * DAY_NS + v.nanoseconds as f64
        }
        _ => return None,
    })
}

/// The bytes of a scalar's value (not of its Rust representation).
fn scalar_bytes(s: &ScalarValue) -> usize {
    if s.is_null() {
        return 0;
    }
    match s.to_array_of_size(1) {
        Ok(a) => value_sizes(a.as_ref()).first().copied().unwrap_or(0),
        Err(_) => s.size(),
    }
}

/// The bytes of each value of `a` (its data, not its buffers' capacity): a text's or binary's
/// length, a list's elements, a struct's fields.
pub(crate) fn value_sizes(a: &dyn Array) -> Vec<usize> {
    let n = a.len();
    let fixed = |w: usize| vec![w; n];
    match a.data_type() {
        DataType::Null => vec![0; n],
        DataType::Boolean => fixed(1),
        DataType::Utf8 => offsets_sizes(a.as_string::<i32>().value_offsets()),
        DataType::LargeUtf8 => offsets_sizes(a.as_string::<i64>().value_offsets()),
        DataType::Binary => offsets_sizes(a.as_binary::<i32>().value_offsets()),
        DataType::LargeBinary => offsets_sizes(a.as_binary::<i64>().value_offsets()),
        DataType::Utf8View => a
            .as_string_view()
            .views()
            .iter()
            .map(|v| (*v as u32) as usize)
            .collect(),
        DataType::BinaryView => a
            .as_binary_view()
            .views()
            .iter()
            .map(|v| (*v as u32) as usize)
            .collect(),
        DataType::List(_) => {
            let l = a.as_list::<i32>();
            nested_sizes(l.value_offsets(), l.values().as_ref())
        }
        DataType::LargeList(_) => {
            let l = a.as_list::<i64>();
            nested_sizes(l.value_offsets(), l.values().as_ref())
        }
        DataType::Map(_, _) => {
            let m = a.as_map();
            let entries: ArrayRef = Arc::new(m.entries().clone());
            nested_sizes(m.value_offsets(), entries.as_ref())
        }
        DataType::FixedSizeList(_, w) => {
            let l = a.as_fixed_size_list();
            let w = usize::try_from(*w).unwrap_or(0);
            let child = value_sizes(l.values().as_ref());
            (0..n)
                .map(|i| {
                    let start = (l.offset() + i) * w;
                    child.iter().skip(start).take(w).sum()
                })
                .collect()
        }
        DataType::Struct(_) => {
            let s = a.as_struct();
            let mut out = vec![0usize; n];
            for c in s.columns() {
                for (o, v) in out.iter_mut().zip(value_sizes(c.as_ref())) {
                    *o = o.saturating_add(v);
                }
            }
            out
        }
        DataType::Dictionary(_, _) => {
            let d = a.as_any_dictionary();
            let values = value_sizes(d.values().as_ref());
            d.normalized_keys()
                .iter()
                .map(|k| values.get(*k).copied().unwrap_or(0))
                .collect()
        }
        t => match t.primitive_width() {
            Some(w) => fixed(w),
            None => {
                let each = a.get_array_memory_size() / n.max(1);
                fixed(each)
            }
        },
    }
}

/// Sizes of values between consecutive offsets.
fn offsets_sizes<O: crate::df::arrow::array::OffsetSizeTrait>(offsets: &[O]) -> Vec<usize> {
    offsets
        .windows(2)
        .map(|w| (w[1].as_usize()).saturating_sub(w[0].as_usize()))
        .collect()
}

/// Sizes of lists: the sum of their elements' sizes in `values`.
fn nested_sizes<O: crate::df::arrow::array::OffsetSizeTrait>(
    offsets: &[O],
    values: &dyn Array,
) -> Vec<usize> {
    let child = value_sizes(values);
    let mut prefix = Vec::with_capacity(child.len() + 1);
    prefix.push(0usize);
    for c in &child {
        let last = *prefix.last().unwrap_or(&0);
        prefix.push(last.saturating_add(*c));
    }
    offsets
        .windows(2)
        .map(|w| {
            let (a, b) = (w[0].as_usize(), w[1].as_usize());
            let at = |k: usize| prefix.get(k.min(child.len())).copied().unwrap_or(0);
            // Offsets plus the elements' data.
            at(b)
                .saturating_sub(at(a))
                .saturating_add((b.saturating_sub(a)) * 4)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::SqlContext;

    #[test]
    fn every_function_of_the_registry_is_classified() {
        let cx = SqlContext::new();
        let unknown: Vec<&str> = cx
            .function_names()
            .filter(|n| growth(n) == Growth::Unknown)
            .collect();
        assert!(
            unknown.is_empty(),
            "functions of DataFusion's registry in neither list of guard.rs: {unknown:?}; say how each one's result grows"
        );
    }

    #[test]
    fn value_sizes_count_data_not_buffers() {
        use crate::df::arrow::array::{ListArray, StringArray};
        let s = StringArray::from(vec![Some("ab"), None, Some("abcd")]);
        assert_eq!(value_sizes(&s), [2, 0, 4]);
        assert_eq!(value_sizes(&s.slice(1, 2)), [0, 4]);
        let l =
            ListArray::from_iter_primitive::<crate::df::arrow::datatypes::Int64Type, _, _>(vec![
                Some(vec![Some(1), Some(2)]),
                Some(vec![]),
            ]);
        assert_eq!(value_sizes(&l), [2 * 8 + 2 * 4, 0]);
    }

    #[test]
    fn estimates_follow_what_the_arguments_ask_for() {
        let text = |b: f64| Arg {
            bytes: b,
            ..Arg::default()
        };
        let num = |n: f64| Arg {
            bytes: 8.0,
            number: n.abs(),
            signed: n,
            instant: None,
        };
        assert_eq!(estimate(Growth::Repeat, &[text(10.0), num(1e8)]), 1e9);
        assert!(estimate(Growth::Pad, &[text(10.0), num(2e9), text(1.0)]) >= 8e9);
        assert!(estimate(Growth::Series, &[num(0.0), num(9.2e18)]) > 7e19);
        // range(1, 10, 3): 4 elements, estimated from the magnitudes (at most 5).
        let e = estimate(Growth::Series, &[num(1.0), num(10.0), num(3.0)]);
        assert!((32.0..=40.0).contains(&e), "{e}");
        // An unknown function's numbers count as bytes each.
        assert!(estimate(Growth::Unknown, &[text(10.0), num(1e9)]) > 1e10);
        // A bounded function asks for about its arguments, whatever their values.
        assert_eq!(estimate(Growth::Bounded, &[num(1e18), text(10.0)]), 18.0);
        // range(n, n + 3) asks for 4 elements, wherever n is.
        assert_eq!(
            estimate(Growth::Series, &[num(1.5e6), num(1.5e6 + 3.0)]),
            32.0
        );
        assert_eq!(estimate(Growth::Series, &[num(-5.0), num(5.0)]), 88.0);
        // levenshtein's work is the product of its arguments' lengths.
        assert_eq!(estimate(Growth::Quadratic, &[text(2e4), text(2e4)]), 4e8);
    }
}
