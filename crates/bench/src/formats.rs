//! `streamtable-bench formats`: the 10,000-order batch as JSON, as Confluent-framed Avro and as
//! Confluent-framed Protobuf (the same records), each decoded and encoded to Parquet in memory
//! by one invocation.

use std::sync::Arc;
use std::time::Instant;

use super::{median, tempdir};
use crate::backend::{Backend, BackendConfig};
use crate::cli::synthetic_records;
use crate::clock::now_ms;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::generate::avro::AvroProducer;
use crate::generate::protobuf::ProtobufProducer;
use crate::generate::{EventFactory, SourceRecord, esm_event};
use crate::registry::{DirRegistry, Registries};
use crate::spec::{Format, PipelineSpec};
use streamtable::ingest::Ingestor;

/// Schema ids the benchmark's producers register their schemas under.
const AVRO_ID: u32 = 1;
const PROTOBUF_ID: u32 = 2;

pub(super) async fn formats(
    config: &Config,
    records: u64,
    partitions: i32,
    iterations: usize,
) -> Result<()> {
    let json_spec = super::spine_spec(config)?;
    let in_format = |format: Format| -> Result<PipelineSpec> {
        let mut spec = json_spec.clone();
        let orders = spec
            .tables
            .iter_mut()
            .find(|t| t.topic == "orders")
            .ok_or_else(|| Error::Config("the spec has no table for topic orders".into()))?;
        orders.format = format;
        Ok(spec)
    };
    let avro_spec = in_format(Format::Avro)?;
    let protobuf_spec = in_format(Format::Protobuf)?;
    let orders = json_spec
        .tables
        .iter()
        .find(|t| t.topic == "orders")
        .ok_or_else(|| Error::Config("the spec has no table for topic orders".into()))?;
    let avro = AvroProducer::new(orders, AVRO_ID);
    let protobuf = ProtobufProducer::new(orders, PROTOBUF_ID)?;

    let mut factory = EventFactory::new(42);
    let mut offsets = vec![0; partitions.max(1) as usize];
    let json_records = synthetic_records(
        &mut factory,
        "orders",
        records,
        &mut offsets,
        0,
        0,
        now_ms() - 3_600_000,
    );
    let reencode = |encode: &dyn Fn(&str) -> Option<Vec<u8>>| -> Vec<SourceRecord> {
        json_records
            .iter()
            .map(|r| {
                let mut r = r.clone();
                let json = r.value.as_deref().and_then(|v| std::str::from_utf8(v).ok());
                if let Some(value) = json.and_then(encode) {
                    r.value = Some(value);
                }
                r
            })
            .collect()
    };
    let avro_records = reencode(&|j| avro.encode_json(j).ok());
    let protobuf_records = reencode(&|j| protobuf.encode_json(j).ok());
    let registry = tempdir("bench-registry")?;
    for (file, schema) in [
        (format!("{AVRO_ID}.avsc"), avro.schema()),
        (format!("{PROTOBUF_ID}.proto"), protobuf.schema()),
    ] {
        std::fs::write(registry.join(file), schema).map_err(|source| Error::Io {
            op: "write schema",
            path: registry.clone(),
            source,
        })?;
    }
    let registries = Registries::of(Some(Arc::new(DirRegistry::new(&registry))), None);

    println!("batch: {records} order records over {partitions} partitions, one invocation");
    for (name, spec, recs) in [
        ("json", &json_spec, &json_records),
        ("avro", &avro_spec, &avro_records),
        ("protobuf", &protobuf_spec, &protobuf_records),
    ] {
        let payload: usize = recs
            .iter()
            .filter_map(|r| r.value.as_ref())
            .map(Vec::len)
            .sum();
        let event = esm_event(recs);
        run_one(
            name,
            spec,
            &registries,
            &event,
            payload,
            records,
            iterations,
        )
        .await?;
    }
    Ok(())
}

async fn run_one(
    name: &str,
    spec: &PipelineSpec,
    registries: &Registries,
    event: &str,
    payload: usize,
    records: u64,
    iterations: usize,
) -> Result<()> {
    let scratch = tempdir(&format!("bench-formats-{name}"))?;
    let backend = Backend::connect(&BackendConfig::Embedded { home: scratch }).await?;
    let ingestor = Ingestor::new(spec, &backend)?.with_registries(registries.clone());
    let mut total_ms = Vec::new();
    let mut parquet = 0;
    // One untimed run fetches the schema (Avro) and warms the allocator.
    for i in 0..=iterations {
        let t0 = Instant::now();
        let parsed: crate::esm::EsmEvent = serde_json::from_str(event)
            .map_err(|e| Error::Internal(format!("bench event: {e}")))?;
        let (n, files) = ingestor.encode_event(&parsed).await?;
        let elapsed = t0.elapsed().as_secs_f64() * 1e3;
        if n != records {
            return Err(Error::Internal(format!(
                "bench {name}: encoded {n} of {records} records"
            )));
        }
        let rows: u64 = files
            .iter()
            .filter(|f| f.table == "orders")
            .map(|f| f.data_file.record_count())
            .sum();
        if rows != records {
            return Err(Error::Internal(format!(
                "bench {name}: {rows} of {records} records landed in orders (the rest were dead letters)"
            )));
        }
        parquet = files.iter().map(|f| f.bytes.len()).sum::<usize>();
        if i > 0 {
            total_ms.push(elapsed);
        }
    }
    let t = median(total_ms);
    println!(
        "{name}: median {t:.1} ms = {:.0} records/s per core, {:.1} MB/s of event, {:.1} MB/s of \
         record values ({:.2} MB of values, {:.0} bytes per record; event {:.2} MB; Parquet {:.2} MB)",
        records as f64 / (t / 1e3),
        event.len() as f64 / 1e6 / (t / 1e3),
        payload as f64 / 1e6 / (t / 1e3),
        payload as f64 / 1e6,
        payload as f64 / records as f64,
        event.len() as f64 / 1e6,
        parquet as f64 / 1e6
    );
    Ok(())
}
