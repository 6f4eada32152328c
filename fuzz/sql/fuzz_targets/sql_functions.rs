#![no_main]

// Any function of DataFusion's registry with hostile arguments, in a derived table's SQL, on
// hostile rows: planned or refused, then every row lands or fails; nothing panics, and the
// fuzzer's memory limit fails an input whose evaluation allocates without bound.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    streamtable_process::fuzz::sql_call(data);
});
