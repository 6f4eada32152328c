//! The aggregate the windowed tables' views merge `approx_distinct` sketches with in
//! `streamtable query`: the estimated count of the union of the sketches (base64 strings in the
//! partial rows' `…__hll` columns), as Athena's
//! `cardinality(merge(CAST(from_base64(…) AS HyperLogLog)))`.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::logical_expr::{Accumulator, AggregateUDF, Volatility, create_udaf};

use crate::process::sketch::{MERGE_SKETCHES, Sketch};

/// The aggregate, to register on a session.
pub fn merge_sketches() -> AggregateUDF {
    create_udaf(
        MERGE_SKETCHES,
        vec![DataType::Utf8],
        Arc::new(DataType::Int64),
        Volatility::Immutable,
        Arc::new(|_| Ok(Box::new(Union(Sketch::default())))),
        Arc::new(vec![DataType::Binary]),
    )
}

#[derive(Debug)]
struct Union(Sketch);

impl Accumulator for Union {
    fn update_batch(&mut self, values: &[ArrayRef]) -> datafusion::common::Result<()> {
        let Some(values) = values.first() else {
            return Ok(());
        };
        let strings = datafusion::arrow::compute::cast(values, &DataType::Utf8)?;
        for text in strings.as_string::<i32>().iter().flatten() {
            let sketch = Sketch::from_base64(text).map_err(|e| {
                DataFusionError::Execution(format!(
                    "{MERGE_SKETCHES}: a partial row's sketch cannot be read ({e}); was the table written by streamtable?"
                ))
            })?;
            self.0.merge(&sketch);
        }
        Ok(())
    }

    fn evaluate(&mut self) -> datafusion::common::Result<ScalarValue> {
        Ok(ScalarValue::Int64(Some(self.0.estimate())))
    }

    fn size(&self) -> usize {
        std::mem::size_of::<Self>() + 2048
    }

    fn state(&mut self) -> datafusion::common::Result<Vec<ScalarValue>> {
        Ok(vec![ScalarValue::Binary(Some(self.0.registers()))])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> datafusion::common::Result<()> {
        let Some(states) = states.first() else {
            return Ok(());
        };
        for registers in states.as_binary::<i32>().iter().flatten() {
            let sketch = Sketch::from_registers(registers)
                .map_err(|e| DataFusionError::Internal(format!("{MERGE_SKETCHES} state: {e}")))?;
            self.0.merge(&sketch);
        }
        Ok(())
    }
}
