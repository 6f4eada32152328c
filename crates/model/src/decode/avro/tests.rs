//! Edge cases of the framing and the reader on hand-made bytes. Records written by real
//! serializers (fastavro, framed as Confluent's and Glue's serializers frame them) are read in
//! `tests/formats_*.rs`.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::decode::RegistryDecoder;
use crate::spec::PipelineSpec;

const SPEC: &str = r#"
[[tables]]
name = "orders"
topic = "orders"
format = "avro"
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "customer_id", type = "string", path = "$.customer.id" },
  { name = "amount", type = "decimal(18,2)", required = true },
  { name = "qty", type = "long" },
  { name = "created_at", type = "timestamp", required = true },
  { name = "status", type = "string" },
]
"#;

const WRITER: &str = r#"{"type":"record","name":"Order","fields":[
  {"name":"order_id","type":"string"},
  {"name":"extra","type":{"type":"array","items":{"type":"map","values":"double"}}},
  {"name":"customer","type":["null",{"type":"record","name":"C","fields":[{"name":"id","type":"string"},{"name":"n","type":"int"}]}]},
  {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":1}},
  {"name":"qty","type":"int"},
  {"name":"created_at","type":{"type":"long","logicalType":"timestamp-millis"}},
  {"name":"status","type":{"type":"enum","name":"S","symbols":["NEW","PAID"]}}
]}"#;

fn decoder() -> AvroDecoder {
    let spec = PipelineSpec::parse(SPEC, Path::new("t.toml"), &crate::spec::NoSql).expect("spec");
    let d = AvroDecoder::new(&spec.tables[0]);
    d.add_schema(SchemaId::Confluent(7), "AVRO", WRITER);
    d
}

fn long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    long(out, s.len() as i64);
    out.extend_from_slice(s);
}

/// The body of one order: `amount` as unscaled bytes at scale 1.
fn body(customer: Option<&str>, amount: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    string(&mut b, b"o-1");
    // extra: one block of one map {"x": 1.5}, then the end.
    long(&mut b, 1);
    long(&mut b, 1);
    string(&mut b, b"x");
    b.extend_from_slice(&1.5f64.to_le_bytes());
    long(&mut b, 0);
    long(&mut b, 0);
    match customer {
        None => long(&mut b, 0),
        Some(id) => {
            long(&mut b, 1);
            string(&mut b, id.as_bytes());
            long(&mut b, 5);
        }
    }
    string(&mut b, amount);
    long(&mut b, 3);
    long(&mut b, 1_795_946_400_000);
    long(&mut b, 1);
    b
}

fn confluent(id: u32, body: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn decode(value: &[u8]) -> Result<Vec<Cell<'static>>, Rejection> {
    let mut scratch = Vec::new();
    decoder()
        .decode(value, &mut scratch, 1 << 20)
        .map(|cells| cells.into_iter().map(owned).collect())
}

fn owned(c: Cell<'_>) -> Cell<'static> {
    match c {
        Cell::Str(s) => Cell::Str(Cow::Owned(s.into_owned())),
        Cell::Null => Cell::Null,
        Cell::Int(v) => Cell::Int(v),
        Cell::Long(v) => Cell::Long(v),
        Cell::Float(v) => Cell::Float(v),
        Cell::Double(v) => Cell::Double(v),
        Cell::Bool(v) => Cell::Bool(v),
        Cell::Date(v) => Cell::Date(v),
        Cell::Timestamp(v) => Cell::Timestamp(v),
        Cell::Decimal(v) => Cell::Decimal(v),
    }
}

#[test]
fn reads_nested_fields_logical_types_and_skips_the_rest() {
    // 1234.5 at scale 1 = 12345 = 0x3039.
    let cells = decode(&confluent(7, &body(Some("c-9"), &[0x30, 0x39]))).expect("decodes");
    assert_eq!(cells[0], Cell::Str(Cow::Borrowed("o-1")));
    assert_eq!(cells[1], Cell::Str(Cow::Borrowed("c-9")));
    assert_eq!(cells[2], Cell::Decimal(123_450));
    assert_eq!(cells[3], Cell::Long(3));
    assert_eq!(cells[4], Cell::Timestamp(1_795_946_400_000_000));
    assert_eq!(cells[5], Cell::Str(Cow::Borrowed("PAID")));
    // A null branch leaves the nested columns NULL; a negative decimal keeps its sign.
    let cells = decode(&confluent(7, &body(None, &[0xff, 0x85]))).expect("decodes");
    assert_eq!(cells[1], Cell::Null);
    assert_eq!(cells[2], Cell::Decimal(-1_230));
}

#[test]
fn glue_framing_plain_and_zlib() {
    let d = decoder();
    let uuid = uuid::Uuid::from_u128(0x1234);
    d.add_schema(SchemaId::Glue(uuid), "AVRO", WRITER);
    let b = body(Some("c"), &[0x01]);
    let mut plain = vec![3, 0];
    plain.extend_from_slice(uuid.as_bytes());
    plain.extend_from_slice(&b);
    let mut zlib = vec![3, 5];
    zlib.extend_from_slice(uuid.as_bytes());
    let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(&b).expect("compress");
    zlib.extend_from_slice(&enc.finish().expect("compress"));
    for value in [plain, zlib] {
        let mut scratch = Vec::new();
        let cells = d.decode(&value, &mut scratch, 1 << 20).expect("decodes");
        assert_eq!(cells[2], Cell::Decimal(10));
    }
    let mut scratch = Vec::new();
    let mut bomb = vec![3, 5];
    bomb.extend_from_slice(uuid.as_bytes());
    let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(&vec![0u8; 10_000]).expect("compress");
    bomb.extend_from_slice(&enc.finish().expect("compress"));
    let r = d
        .decode(&bomb, &mut scratch, 1000)
        .expect_err("over the limit");
    assert_eq!(r.kind, RejectKind::Oversize);
}

#[test]
fn every_bad_value_is_a_rejection_with_a_reason() {
    let good = body(Some("c"), &[0x01]);
    let cases: Vec<(Vec<u8>, RejectKind, &str)> = vec![
        (
            b"{\"json\":1}".to_vec(),
            RejectKind::NoSchemaId,
            "first byte 123",
        ),
        (
            vec![0, 0, 0],
            RejectKind::NoSchemaId,
            "no schema registry header",
        ),
        (
            confluent(99, &good),
            RejectKind::UnknownSchema,
            "schema id 99",
        ),
        (
            confluent(7, &good[..good.len() - 3]),
            RejectKind::SchemaMismatch,
            "payload ends",
        ),
        (
            [confluent(7, &good), vec![0]].concat(),
            RejectKind::SchemaMismatch,
            "1 bytes left",
        ),
        // 20 bytes of decimal: more than 38 digits.
        (
            confluent(7, &body(Some("c"), &[0x7f; 20])),
            RejectKind::OutOfRange,
            "column amount",
        ),
        // 10^17 at scale 1 needs 19 digits at the column's scale 2: over decimal(18,2).
        (
            confluent(
                7,
                &body(Some("c"), &1_000_000_000_000_000_000i128.to_be_bytes()),
            ),
            RejectKind::OutOfRange,
            "does not fit decimal(18,2)",
        ),
    ];
    for (value, kind, says) in cases {
        let r = decode(&value).expect_err("rejected");
        assert_eq!(r.kind, kind, "{}", r.message);
        assert!(r.message.contains(says), "{}", r.message);
    }
}

#[test]
fn a_writer_schema_that_does_not_fit_the_columns_names_the_column() {
    let d = decoder();
    d.add_schema(SchemaId::Confluent(8), "AVRO",
        r#"{"type":"record","name":"O","fields":[{"name":"order_id","type":"string"},{"name":"amount","type":"double"},{"name":"created_at","type":"long"}]}"#,
    );
    let mut b = Vec::new();
    string(&mut b, b"o");
    b.extend_from_slice(&1.0f64.to_le_bytes());
    long(&mut b, 0);
    let mut scratch = Vec::new();
    let r = d
        .decode(&confluent(8, &b), &mut scratch, 1 << 20)
        .expect_err("double cannot fill a decimal");
    assert_eq!(r.kind, RejectKind::WrongType);
    assert!(
        r.message.contains("column amount") && r.message.contains("double"),
        "{}",
        r.message
    );
    // A required column the writer's schema lacks.
    d.add_schema(
        SchemaId::Confluent(9),
        "AVRO",
        r#"{"type":"record","name":"O","fields":[{"name":"order_id","type":"string"}]}"#,
    );
    let mut b = Vec::new();
    string(&mut b, b"o");
    let r = d
        .decode(&confluent(9, &b), &mut scratch, 1 << 20)
        .expect_err("amount is required");
    assert_eq!(r.kind, RejectKind::MissingField);
    assert!(r.message.contains("amount"), "{}", r.message);
    // A schema the registry serves that does not parse.
    d.add_schema(SchemaId::Confluent(10), "AVRO", "{");
    let r = d
        .decode(&confluent(10, &b), &mut scratch, 1 << 20)
        .expect_err("unreadable schema");
    assert_eq!(r.kind, RejectKind::UnknownSchema);
}

proptest! {
    /// No payload makes the reader panic, hang or allocate without bound.
    #[test]
    fn any_bytes_decode_or_are_rejected(body in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(&confluent(7, &body));
    }

    /// Cutting a good body anywhere is a rejection, never a wrong row.
    #[test]
    fn a_cut_body_is_rejected(cut in 0usize..40) {
        let good = body(Some("c"), &[0x01]);
        prop_assume!(cut < good.len());
        prop_assert!(decode(&confluent(7, &good[..cut])).is_err());
    }
}

/// Named records reused as fields: `R_k` has two fields of type `R_{k-1}`, so one record of
/// `R_40` holds 2^40 nulls in zero bytes. Reading it is refused within the body's visit budget
/// (it ran for minutes when only array items were counted).
#[test]
fn a_schema_of_reused_records_cannot_make_a_tiny_body_cost_exponential_work() {
    let mut schema =
        String::from(r#"{"type":"record","name":"R0","fields":[{"name":"n","type":"null"}]}"#);
    for k in 1..=40 {
        schema = if k == 1 {
            format!(
                r#"{{"type":"record","name":"R1","fields":[{{"name":"a","type":{schema}}},{{"name":"b","type":"R0"}}]}}"#
            )
        } else {
            format!(
                r#"{{"type":"record","name":"R{k}","fields":[{{"name":"a","type":{schema}}},{{"name":"b","type":"R{}"}}]}}"#,
                k - 1
            )
        };
    }
    let wrapper = format!(
        r#"{{"type":"record","name":"Order","fields":[{{"name":"order_id","type":"string"}},{{"name":"deep","type":{schema}}}]}}"#
    );
    let d = decoder();
    d.add_schema(SchemaId::Confluent(8), "AVRO", &wrapper);
    let mut b = Vec::new();
    string(&mut b, b"o-1");
    let mut scratch = Vec::new();
    let r = d
        .decode(&confluent(8, &b), &mut scratch, 1 << 20)
        .expect_err("over the visit budget");
    assert_eq!(r.kind, RejectKind::SchemaMismatch, "{}", r.message);
    assert!(r.message.contains("the limit"), "{}", r.message);
}

/// A Debezium upsert table over Avro change events, its columns read from `after`, the source
/// position from `source`, the operation from `op`.
const DEBEZIUM: &str = r#"
[[tables]]
name = "customers"
topic = "pg.public.customers"
format = "avro"
mode = "upsert"
envelope = "debezium"
primary_key = ["customer_id"]
columns = [
  { name = "customer_id", type = "long", required = true, path = "$.id" },
  { name = "email", type = "string" },
  { name = "since", type = "timestamp" },
  { name = "source_lsn", type = "long", path = "$.__source.lsn" },
  { name = "op", type = "string", path = "$.__op" },
]
"#;

/// The envelope Debezium's AvroConverter registers for a PostgreSQL table (abridged `source`),
/// `since` a MicroTimestamp as the connector's default `time.precision.mode` writes it.
const ENVELOPE: &str = r#"{"type":"record","name":"Envelope","namespace":"pg.public.customers","fields":[
  {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
    {"name":"id","type":"long"},
    {"name":"email","type":["null","string"],"default":null},
    {"name":"since","type":["null",{"type":"long","connect.version":1,"connect.name":"io.debezium.time.MicroTimestamp"}],"default":null}
  ],"connect.name":"pg.public.customers.Value"}],"default":null},
  {"name":"after","type":["null","Value"],"default":null},
  {"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium.connector.postgresql","fields":[
    {"name":"version","type":"string"},{"name":"ts_ms","type":"long"},
    {"name":"lsn","type":["null","long"],"default":null}]}},
  {"name":"op","type":"string"},
  {"name":"ts_ms","type":["null","long"],"default":null}
],"connect.name":"pg.public.customers.Envelope"}"#;

/// One change event: `before` and `after` as (id, email, since µs) when present.
fn change_event(
    op: &str,
    before: Option<(i64, Option<&str>, i64)>,
    after: Option<(i64, Option<&str>, i64)>,
    lsn: i64,
) -> Vec<u8> {
    let mut b = Vec::new();
    for row in [before, after] {
        match row {
            None => long(&mut b, 0),
            Some((id, email, since)) => {
                long(&mut b, 1);
                long(&mut b, id);
                match email {
                    None => long(&mut b, 0),
                    Some(e) => {
                        long(&mut b, 1);
                        string(&mut b, e.as_bytes());
                    }
                }
                long(&mut b, 1);
                long(&mut b, since);
            }
        }
    }
    string(&mut b, b"2.7.0.Final");
    long(&mut b, 1_700_000_000_000);
    long(&mut b, 1);
    long(&mut b, lsn);
    string(&mut b, op.as_bytes());
    long(&mut b, 0);
    confluent(9, &b)
}

#[test]
fn debezium_change_events_in_avro_are_rows_and_deletes() {
    let spec =
        PipelineSpec::parse(DEBEZIUM, Path::new("t.toml"), &crate::spec::NoSql).expect("spec");
    let d = AvroDecoder::new(&spec.tables[0]);
    assert!(d.reads_changes());
    d.add_schema(SchemaId::Confluent(9), "AVRO", ENVELOPE);
    let mut scratch = Vec::new();
    let since = 1_700_000_000_123_456; // microseconds
    let create = change_event("c", None, Some((7, Some("a@x"), since)), 24_023_128);
    let got = d.change(&create, &mut scratch, 1 << 20).expect("create");
    assert_eq!(
        got,
        AvroChange::Upsert(vec![
            Cell::Long(7),
            Cell::Str(Cow::Borrowed("a@x")),
            Cell::Timestamp(since),
            Cell::Long(24_023_128),
            Cell::Str(Cow::Borrowed("c")),
        ])
    );
    let delete = change_event("d", Some((7, None, 0)), None, 24_023_200);
    assert_eq!(
        d.change(&delete, &mut scratch, 1 << 20).expect("delete"),
        AvroChange::Delete(Some(vec![Cell::Long(7)]))
    );
    let no_before = change_event("d", None, None, 24_023_201);
    assert_eq!(
        d.change(&no_before, &mut scratch, 1 << 20).expect("delete"),
        AvroChange::Delete(None),
        "the Kafka key names it"
    );
    // A decoder of rows reads a change of a row as the row, and refuses a delete.
    assert!(d.decode(&create, &mut scratch, 1 << 20).is_ok());
    assert_eq!(
        d.decode(&delete, &mut scratch, 1 << 20)
            .expect_err("delete")
            .kind,
        RejectKind::Envelope
    );
    for (event, kind, why) in [
        (
            change_event("t", None, None, 1),
            RejectKind::Envelope,
            "truncate",
        ),
        (
            change_event("u", Some((7, None, 0)), None, 1),
            RejectKind::Envelope,
            "without an after record",
        ),
        (
            change_event(
                "u",
                None,
                Some((7, Some("__debezium_unavailable_value"), 0)),
                1,
            ),
            RejectKind::Envelope,
            "REPLICA IDENTITY FULL",
        ),
        (
            change_event("c", None, Some((7, None, i64::MAX)), 1),
            RejectKind::OutOfRange,
            "since",
        ),
    ] {
        let err = d.change(&event, &mut scratch, 1 << 20).expect_err(why);
        assert_eq!(err.kind, kind, "{why}: {}", err.message);
        assert!(err.message.contains(why), "{why}: {}", err.message);
    }
    // Every cut of an event is refused, never a panic.
    for cut in 5..create.len() {
        assert!(d.change(&create[..cut], &mut scratch, 1 << 20).is_err());
    }
}

#[test]
fn debezium_nano_timestamps_and_times_of_day_are_read_by_what_they_are() {
    let spec = PipelineSpec::parse(
        r#"
[[tables]]
name = "t"
topic = "t"
format = "avro"
columns = [
  { name = "at", type = "timestamp", required = true },
  { name = "opens", type = "long" },
]
"#,
        Path::new("t.toml"),
        &crate::spec::NoSql,
    )
    .expect("spec");
    let d = AvroDecoder::new(&spec.tables[0]);
    let writer = |opens: &str| {
        format!(
            r#"{{"type":"record","name":"V","fields":[
              {{"name":"at","type":{{"type":"long","connect.name":"io.debezium.time.NanoTimestamp"}}}},
              {{"name":"opens","type":{{"type":"long","connect.name":"io.debezium.time.{opens}"}}}}]}}"#
        )
    };
    d.add_schema(SchemaId::Confluent(1), "AVRO", &writer("MicroTime"));
    let mut b = Vec::new();
    long(&mut b, 1_795_946_400_123_456_789);
    long(&mut b, 32_400_000_000); // 09:00 in microseconds
    let mut scratch = Vec::new();
    let value = confluent(1, &b);
    let cells = d.decode(&value, &mut scratch, 1 << 20).expect("reads");
    assert_eq!(
        cells,
        [
            Cell::Timestamp(1_795_946_400_123_456),
            Cell::Long(32_400_000_000)
        ]
    );
    // A time of day is no timestamp: a timestamp column refuses it, naming the column.
    let swapped = PipelineSpec::parse(
        r#"
[[tables]]
name = "t"
topic = "t"
format = "avro"
columns = [{ name = "opens", type = "timestamp" }]
"#,
        Path::new("t.toml"),
        &crate::spec::NoSql,
    )
    .expect("spec");
    let d = AvroDecoder::new(&swapped.tables[0]);
    d.add_schema(SchemaId::Confluent(1), "AVRO", &writer("MicroTime"));
    let err = d
        .decode(&value, &mut scratch, 1 << 20)
        .expect_err("a time of day");
    assert_eq!(err.kind, RejectKind::WrongType, "{}", err.message);
    assert!(err.message.contains("opens"), "{}", err.message);
}
