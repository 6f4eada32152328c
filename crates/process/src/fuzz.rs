//! The property the `sql_functions` fuzz target checks (`fuzz/sql/`), and the test suite with
//! it: any function of DataFusion's registry, called with hostile arguments in a derived
//! table's SQL, is planned or refused, and evaluated on hostile rows into rows or failures —
//! nothing panics, and nothing allocates without bound (the fuzzer's memory limit fails an
//! input that does).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::Processor;
use crate::kafka::RecordMeta;
use crate::schema::TableLayout;
use crate::spec::PipelineSpec;
use streamtable_model::decode::{RecordDecoder, RowBuilder};

/// Arguments a call is given: the table's columns, hostile constants, nested values and a call
/// that makes a larger value.
const ARGS: &[&str] = &[
    "s",
    "n",
    "d",
    "ts",
    "0",
    "-1",
    "1",
    "2",
    "100000000",
    "-100000000",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "1e308",
    "-1e308",
    "CAST('NaN' AS DOUBLE)",
    "0.5",
    "''",
    "'x'",
    "'%'",
    "'é'",
    "'\\'",
    "NULL",
    "TIMESTAMP '1970-01-01 00:00:00'",
    "TIMESTAMP '2262-04-11 23:47:16'",
    "DATE '2024-02-29'",
    "INTERVAL '1 microsecond'",
    "INTERVAL '100000 years'",
    "INTERVAL '-1 day'",
    "make_array(s)",
    "make_array(n, n)",
    "make_array(make_array(n))",
    "named_struct('a', n)",
    "repeat(s, 1000)",
    "CAST(n AS INT)",
];

/// Values of the rows' columns.
const NUMBERS: &[i64] = &[
    0,
    1,
    -1,
    7,
    100_000_000,
    -100_000_000,
    i32::MAX as i64 + 1,
    i64::MAX,
    i64::MIN,
];
const TEXTS: &[&str] = &["", "x", "abc", "%_\\\\", "ééé", "\\u0000"];
const DOUBLES: &[&str] = &["0", "-0.0", "1e308", "-1e308", "5e-324", "3.5"];
const TIMES: &[&str] = &[
    "2026-12-07T10:00:00Z",
    "1970-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00Z",
];

/// The function names of the registry, in order.
fn names() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut n: Vec<String> = crate::context::SqlContext::new()
            .function_names()
            .map(str::to_string)
            .collect();
        n.sort();
        n
    })
}

/// A spec of one topic's table `t` (`s` text, `n` long, `d` double, `ts` timestamp) and a
/// derived table of `sql`.
fn spec(sql: &str) -> Option<PipelineSpec> {
    let text = format!(
        r#"
[[tables]]
name = "t"
topic = "t"
columns = [
  {{ name = "s", type = "string" }},
  {{ name = "n", type = "long" }},
  {{ name = "d", type = "double" }},
  {{ name = "ts", type = "timestamp" }},
]

[[derived_tables]]
name = "out"
sql = """{sql}"""
"#
    );
    PipelineSpec::parse(&text, std::path::Path::new("fuzz.toml"), &crate::Planner).ok()
}

/// Plans, once per SQL (a few hundred kept), the processor of `sql`.
fn processor(sql: &str) -> Option<Arc<(PipelineSpec, Processor)>> {
    type Cache = Mutex<HashMap<String, Option<Arc<(PipelineSpec, Processor)>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(p) = cache.lock().ok()?.get(sql) {
        return p.clone();
    }
    let planned = spec(sql).and_then(|s| {
        let p = Processor::new(&s).ok()?;
        Some(Arc::new((s, p)))
    });
    let mut c = cache.lock().ok()?;
    if c.len() > 512 {
        c.clear();
    }
    c.insert(sql.to_string(), planned.clone());
    planned
}

/// One input: a function of the registry, up to three arguments, three rows.
pub fn sql_call(data: &[u8]) {
    let mut bytes = data.iter().copied();
    let mut next = move || bytes.next().unwrap_or(0) as usize;
    let names = names();
    if names.is_empty() {
        return;
    }
    let f = &names[(next() << 8 | next()) % names.len()];
    let args: Vec<&str> = (0..next() % 4).map(|_| ARGS[next() % ARGS.len()]).collect();
    let sql = format!("SELECT ({f}({})) IS NULL AS x FROM t", args.join(", "));
    let Some(planned) = processor(&sql) else {
        return;
    };
    let (spec, processor) = planned.as_ref();
    let Some(t) = spec.table("t") else { return };
    let Ok(layout) = TableLayout::for_table(t) else {
        return;
    };
    let decoder = RecordDecoder::new(t);
    let Ok(mut rows) = RowBuilder::new(t, Arc::new(layout), 3) else {
        return;
    };
    for i in 0..3 {
        let json = format!(
            r#"{{"s":"{}","n":{},"d":{},"ts":"{}"}}"#,
            TEXTS[next() % TEXTS.len()],
            NUMBERS[next() % NUMBERS.len()],
            DOUBLES[next() % DOUBLES.len()],
            TIMES[next() % TIMES.len()]
        );
        if let Ok(cells) = decoder.decode(&json) {
            rows.append(
                &cells,
                RecordMeta {
                    partition: 0,
                    offset: i,
                    timestamp_us: 0,
                    key: None,
                    headers: &[],
                },
            );
        }
    }
    let Ok(batch) = rows.finish() else { return };
    let n = batch.num_rows();
    let out = processor
        .derive("t", &batch, &mut Default::default(), 0)
        .unwrap_or_else(|e| panic!("{sql}: derive failed as a whole: {e}"));
    for d in out {
        let landed = d.rows.map_or(0, |r| r.num_rows());
        assert_eq!(
            landed + d.failures.len(),
            n,
            "{sql}: every row lands or fails ({:?})",
            d.failures
        );
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn any_call_of_the_registry_lands_or_fails_its_rows(data in prop::collection::vec(any::<u8>(), 0..24)) {
            super::sql_call(&data);
        }
    }

    /// Every input the coverage-guided fuzzer found (and the seeds), replayed.
    #[test]
    fn fuzz_findings_stay_fixed() {
        let dir = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/regressions/sql_functions"
        ));
        let mut n = 0;
        for entry in std::fs::read_dir(dir)
            .expect("fuzz/regressions/sql_functions")
            .flatten()
        {
            super::sql_call(&std::fs::read(entry.path()).expect("finding"));
            n += 1;
        }
        assert!(n > 0, "seeds in {}", dir.display());
    }

    /// Every function of the registry, with hostile numbers in the places functions take
    /// counts, lengths and positions, and a range of instants one microsecond apart.
    #[test]
    fn every_function_with_hostile_numbers() {
        // Indices into ARGS: s, n, 9223372036854775807, 100000000, make_array(n, n),
        // ts, TIMESTAMP '2262-…', INTERVAL '1 microsecond'.
        let (s, n, max, big, array, ts, late, micro) = (0u8, 1u8, 12u8, 8u8, 31u8, 3u8, 25u8, 27u8);
        let patterns: [&[u8]; 10] = [
            &[s, max],
            &[s, big],
            &[s, max, s],
            &[max],
            &[s, n, n],
            &[array, max],
            &[array, big, n],
            &[n, max],
            &[ts, late, micro],
            &[max, n, big],
        ];
        let names = super::names();
        let mut planned = 0;
        for (i, name) in names.iter().enumerate() {
            for args in patterns {
                let (hi, lo) = ((i >> 8) as u8, (i & 0xff) as u8);
                let mut input = vec![hi, lo, args.len() as u8];
                input.extend(args);
                // Rows: the largest number, then the others.
                input.extend([0, 7, 2, 0, 1, 4, 3, 1, 2, 8, 1, 2]);
                super::sql_call(&input);
                let sql = format!(
                    "SELECT ({}({})) IS NULL AS x FROM t",
                    name,
                    args.iter()
                        .map(|a| super::ARGS[*a as usize])
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                planned += usize::from(super::processor(&sql).is_some());
            }
        }
        // Most patterns do not fit most functions; enough do to reach the guarded ones.
        assert!(planned > 150, "{planned} calls planned");
    }
}
