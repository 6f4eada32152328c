//! `now()` and `current_timestamp` in `streamtable query` and the dashboards read the backend's
//! clock (the system clock in production, a manual one in tests), so that the dashboards' "last
//! 7 days" bounds mean the same on the embedded engine as in Athena, and tests over fixed
//! event times stay correct whatever the date they run on.

use std::any::Any;

use arrow_schema::{DataType, TimeUnit};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// `now()` fixed at `now_ms` (epoch milliseconds, UTC).
#[derive(Debug, PartialEq, Eq, Hash)]
struct ClockNow {
    signature: Signature,
    aliases: Vec<String>,
    now_ns: i64,
}

/// The `now()` / `current_timestamp` of a session whose clock reads `now_ms`.
pub fn now_udf(now_ms: i64) -> ScalarUDF {
    ScalarUDF::from(ClockNow {
        signature: Signature::nullary(Volatility::Stable),
        aliases: vec!["current_timestamp".to_string()],
        now_ns: now_ms.saturating_mul(1_000_000),
    })
}

impl ScalarUDFImpl for ClockNow {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "now"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Timestamp(TimeUnit::Nanosecond, None))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(ColumnarValue::Scalar(ScalarValue::TimestampNanosecond(
            Some(self.now_ns),
            None,
        )))
    }

    fn simplify(&self, _args: Vec<Expr>, _info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        Ok(ExprSimplifyResult::Simplified(Expr::Literal(
            ScalarValue::TimestampNanosecond(Some(self.now_ns), None),
            None,
        )))
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }
}
