//! Synthetic sources: realistic order, payment and sensor events, and MSK ESM batch events
//! carrying them, for the demo, the benchmarks, the tests and `streamtable generate`.
//!
//! Everything is deterministic from a seed, so a run can be reproduced exactly.

pub mod avro;
pub mod protobuf;

/// What the producers write, their decoders read back: the shared round trip of their tests.
#[cfg(test)]
pub(crate) mod round_trip {
    use std::path::Path;

    use crate::decode::{Decoder, RecordDecoder};
    use crate::spec::{PipelineSpec, TableSpec};

    /// A table with a column of every type, its values in `format`.
    pub fn all_types(format: &str) -> TableSpec {
        let text = format!(
            r#"
[[tables]]
name = "t"
topic = "t"
format = "{format}"
columns = [
  {{ name = "s", type = "string", required = true }},
  {{ name = "i", type = "int" }}, {{ name = "l", type = "long" }}, {{ name = "f", type = "float" }},
  {{ name = "d", type = "double" }}, {{ name = "b", type = "boolean" }}, {{ name = "day", type = "date" }},
  {{ name = "ts", type = "timestamp", required = true }}, {{ name = "m", type = "decimal(18,2)" }},
]
"#
        );
        let spec =
            PipelineSpec::parse(&text, Path::new("t.toml"), &crate::spec::NoSql).expect("spec");
        spec.tables[0].clone()
    }

    /// Each JSON record, written by `encode` (its schema registered as Confluent id `id` of
    /// `kind`), decodes to the cells the JSON decoder reads from it.
    pub fn check(
        table: &TableSpec,
        kind: &str,
        id: u32,
        schema: &str,
        encode: impl Fn(&str) -> Vec<u8>,
    ) {
        let decoder = Decoder::new(table);
        decoder.registry().expect("a registry format").add_schema(
            crate::decode::framing::SchemaId::Confluent(id),
            kind,
            schema,
        );
        for json in [
            r#"{"s":"x","i":-7,"l":9007199254740993,"f":1.5,"d":-2.25,"b":true,"day":"2026-11-30","ts":"2026-11-30T10:00:00.123456Z","m":"-128.05"}"#,
            r#"{"s":"","ts":0,"m":"127.99"}"#,
            r#"{"s":"y","ts":"1969-12-31T23:59:59.5Z","m":"-0.01","i":null}"#,
            r#"{"s":"z","ts":1,"m":"0.01"}"#,
            r#"{"s":"w","ts":1,"m":"-128.00","b":false}"#,
        ] {
            let want = RecordDecoder::new(table).decode(json).expect("json");
            let value = encode(json);
            let mut scratch = Vec::new();
            let got = decoder
                .decode(&value, &mut scratch, 1 << 20)
                .expect("decodes");
            assert_eq!(got, want, "{json}");
        }
    }
}

use std::fmt::Write as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// One Kafka record as the ESM delivers it, before base64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
    /// The Kafka timestamp, epoch milliseconds.
    pub timestamp_ms: i64,
    /// The key's bytes.
    pub key: Option<Vec<u8>>,
    /// The value bytes; `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    /// Sends this text verbatim as the base64 value field (to produce invalid base64).
    pub raw_value_field: Option<String>,
}

/// Serialises records as one MSK ESM event (`aws:kafka`), grouped by `topic-partition`.
pub fn esm_event(records: &[SourceRecord]) -> String {
    let mut groups: std::collections::BTreeMap<String, Vec<&SourceRecord>> = Default::default();
    for r in records {
        groups
            .entry(format!("{}-{}", r.topic, r.partition))
            .or_default()
            .push(r);
    }
    let mut out = String::with_capacity(records.len() * 512 + 512);
    out.push_str(r#"{"eventSource":"aws:kafka","eventSourceArn":"arn:aws:kafka:us-east-1:123456789012:cluster/streamtable-demo/00000000-0000-0000-0000-000000000000-1","bootstrapServers":"b-1.streamtable-demo.kafka.us-east-1.amazonaws.com:9098","records":{"#);
    for (gi, (key, recs)) in groups.iter().enumerate() {
        if gi > 0 {
            out.push(',');
        }
        let _ = write!(out, "\"{key}\":[");
        for (ri, r) in recs.iter().enumerate() {
            if ri > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                r#"{{"topic":"{}","partition":{},"offset":{},"timestamp":{},"timestampType":"CREATE_TIME","key":"#,
                r.topic, r.partition, r.offset, r.timestamp_ms
            );
            push_b64(&mut out, r.key.as_deref(), None);
            out.push_str(r#","value":"#);
            push_b64(&mut out, r.value.as_deref(), r.raw_value_field.as_deref());
            out.push_str(r#","headers":[]}"#);
        }
        out.push(']');
    }
    out.push_str("}}");
    out
}

/// The same records as an ESM event value, without the JSON round trip (for the demo and the
/// benchmarks, which feed the handler directly).
pub fn kafka_event(records: &[SourceRecord]) -> crate::esm::EsmEvent {
    use crate::esm::{EsmEvent, EsmRecord};
    let mut event = EsmEvent {
        event_source: Some("aws:kafka".into()),
        ..EsmEvent::default()
    };
    for r in records {
        let k = EsmRecord {
            topic: Some(r.topic.clone()),
            partition: r.partition as i64,
            offset: r.offset,
            timestamp: r.timestamp_ms,
            timestamp_type: Some("CREATE_TIME".into()),
            key: r.key.as_ref().map(|b| STANDARD.encode(b)),
            value: match (&r.raw_value_field, &r.value) {
                (Some(raw), _) => Some(raw.clone()),
                (None, Some(v)) => Some(STANDARD.encode(v)),
                (None, None) => None,
            },
            headers: Vec::new(),
        };
        event
            .records
            .entry(format!("{}-{}", r.topic, r.partition))
            .or_default()
            .push(k);
    }
    event
}

fn push_b64(out: &mut String, bytes: Option<&[u8]>, raw: Option<&str>) {
    match (raw, bytes) {
        (Some(raw), _) => {
            out.push('"');
            out.push_str(raw);
            out.push('"');
        }
        (None, Some(b)) => {
            out.push('"');
            STANDARD.encode_string(b, out);
            out.push('"');
        }
        (None, None) => out.push_str("null"),
    }
}

/// A small, fast, reproducible random source (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// One of `items`, at random.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const COUNTRIES: [&str; 8] = ["US", "DE", "FR", "GB", "JP", "BR", "IN", "CA"];
const CURRENCIES: [&str; 8] = ["USD", "EUR", "EUR", "GBP", "JPY", "BRL", "INR", "CAD"];
const ORDER_STATUS: [&str; 5] = ["placed", "paid", "paid", "shipped", "cancelled"];
/// Euros per unit of each currency the orders use: the demo's `currency_rates` reference table.
pub const CURRENCY_RATES: [(&str, &str); 7] = [
    ("USD", "0.920000"),
    ("EUR", "1.000000"),
    ("GBP", "1.170000"),
    ("JPY", "0.006200"),
    ("BRL", "0.170000"),
    ("INR", "0.011000"),
    ("CAD", "0.680000"),
];
/// The rows of [`CURRENCY_RATES`]: `currency` (string), `rate_to_eur` (decimal(18,6)).
pub fn currency_rates() -> crate::error::Result<arrow_array::RecordBatch> {
    use arrow_array::{ArrayRef, Decimal128Array, StringArray};
    let currencies: ArrayRef = std::sync::Arc::new(StringArray::from_iter_values(
        CURRENCY_RATES.iter().map(|(c, _)| *c),
    ));
    let rates = CURRENCY_RATES
        .iter()
        .map(|(_, r)| crate::decode::value::parse_decimal(r, 18, 6).map_err(|e| format!("{e:?}")))
        .collect::<std::result::Result<Vec<i128>, String>>()
        .map_err(crate::error::Error::Internal)?;
    let rates: ArrayRef = std::sync::Arc::new(
        Decimal128Array::from(rates)
            .with_precision_and_scale(18, 6)
            .map_err(|e| crate::error::Error::Internal(e.to_string()))?,
    );
    arrow_array::RecordBatch::try_from_iter([("currency", currencies), ("rate_to_eur", rates)])
        .map_err(|e| crate::error::Error::Internal(e.to_string()))
}

const METHODS: [&str; 4] = ["card", "paypal", "bank_transfer", "apple_pay"];
/// Share of orders per country, in percent (same order as `COUNTRIES`).
const COUNTRY_WEIGHTS: [u64; 8] = [30, 15, 10, 12, 10, 8, 10, 5];
/// Payment success rate per method, in tenths of a percent (same order as `METHODS`).
const METHOD_SUCCESS: [u64; 4] = [955, 921, 978, 962];
/// How many sensors the readings come from.
pub const SENSORS: u64 = 1000;
/// Sensors report in bursts: the hour is cut into this many slots, and in each slot a share of
/// the sensors reports (every few seconds while the slot lasts) and the others are quiet.
const SENSOR_SLOTS: i64 = 10;
/// The length of a slot: a sensor's readings form one session of about this long, then it is
/// quiet for the rest of the hour, so its session closes (they close after 5 quiet minutes).
const SENSOR_SLOT_MS: i64 = 360_000;

/// The sensor of the `n`-th reading, taken at `at_ms`: one of the tenth of the sensors that
/// report in the time's 6-minute slot of the hour. Producers key readings by sensor, so the
/// sensor also picks the reading's partition.
pub fn sensor_of(n: u64, at_ms: i64) -> u64 {
    let slot = at_ms.div_euclid(SENSOR_SLOT_MS).rem_euclid(SENSOR_SLOTS) as u64;
    let per_slot = SENSORS / SENSOR_SLOTS as u64;
    slot + SENSOR_SLOTS as u64 * (n % per_slot)
}
const SITES: [&str; 5] = ["berlin", "lisbon", "oslo", "austin", "osaka"];

use crate::clock::rfc3339_ms;

/// An index drawn from `rng` with the given weights.
fn weighted(rng: &mut Rng, weights: &[u64]) -> usize {
    let mut r = rng.below(weights.iter().sum());
    for (i, w) in weights.iter().enumerate() {
        if r < *w {
            return i;
        }
        r -= w;
    }
    0
}

/// The topic of order status changes (the `orders_current` upsert table's): each order is
/// placed, then paid or cancelled, then shipped, cancelled or erased (a tombstone), keyed by
/// its order id.
pub const ORDER_STATUS_TOPIC: &str = "order_status";

/// How many orders apart an order's successive status changes are on the topic: an order's
/// payment arrives 100 orders after it was placed, its shipping 200 after.
pub const STATUS_LAG: u64 = 100;

/// The `n`-th event of the order status topic: (the order's number, its step 0, 1 or 2).
/// Events come in threes (a placement, a second and a third change of earlier orders); the
/// first orders of a stream, which no earlier orders precede, get their later steps at once
/// and again when their turn comes (a repeated status: the last one still wins).
pub fn status_event(n: u64) -> (u64, u64) {
    let (m, step) = (n / 3, n % 3);
    (m.checked_sub(step * STATUS_LAG).unwrap_or(m), step)
}

/// The order id of order `k`, as the orders and order status topics write it.
pub fn order_id(k: u64) -> String {
    format!("ord-{k:010}")
}

/// The status of order `k` after its step `step`, `None` when that step erases it (a
/// tombstone): 80% placed → paid → shipped, 10% placed → paid → cancelled, 5% placed →
/// cancelled (the cancellation sent twice), 5% placed → cancelled → erased.
pub fn order_status(k: u64, step: u64) -> Option<&'static str> {
    let path = Rng::new(k ^ 0x5eed).below(20);
    match (step, path) {
        (0, _) => Some("placed"),
        (1, 0..=17) => Some("paid"),
        (1, _) => Some("cancelled"),
        (_, 0..=15) => Some("shipped"),
        (_, 19) => None,
        _ => Some("cancelled"),
    }
}

/// The Kafka partition of order `k`'s status changes among `partitions`: producers key them by
/// the order id, so an order's changes share a partition (and keep their order).
pub fn order_partition(k: u64, partitions: u64) -> u64 {
    Rng::new(k).next_u64() % partitions.max(1)
}

/// Generates the demo's business events.
#[derive(Debug, Clone)]
pub struct EventFactory {
    rng: Rng,
}

impl EventFactory {
    /// A factory whose events follow from `seed`.
    pub fn new(seed: u64) -> EventFactory {
        EventFactory {
            rng: Rng::new(seed),
        }
    }

    /// An index drawn with the given weights.
    fn weighted(&mut self, weights: &[u64]) -> usize {
        weighted(&mut self.rng, weights)
    }

    /// An order placed at `at_ms`; `n` makes its id unique.
    pub fn order(&mut self, n: u64, at_ms: i64) -> String {
        let c = self.weighted(&COUNTRY_WEIGHTS);
        let cents = 500 + self.rng.below(49_500);
        format!(
            r#"{{"order_id":"ord-{n:010}","customer_id":"cus-{:06}","amount":"{}.{:02}","currency":"{}","country":"{}","status":"{}","created_at":"{}","channel":"{}","items":{},"session":"s-{:016x}"}}"#,
            self.rng.below(100_000),
            cents / 100,
            cents % 100,
            CURRENCIES[c],
            COUNTRIES[c],
            self.rng.pick(&ORDER_STATUS),
            rfc3339_ms(at_ms),
            self.rng.pick(&["web", "ios", "android"]),
            1 + self.rng.below(4),
            self.rng.next_u64(),
        )
    }

    /// Order `k`'s status change `step` at `at_ms` ([`order_status`]; `None`: a tombstone).
    /// Its country and amount are the order's own, the same in each of its changes.
    pub fn status_change(&mut self, k: u64, step: u64, at_ms: i64) -> Option<String> {
        let status = order_status(k, step)?;
        let mut order = Rng::new(k.wrapping_add(0x0dd5));
        let c = weighted(&mut order, &COUNTRY_WEIGHTS);
        let cents = 500 + order.below(49_500);
        Some(format!(
            r#"{{"order_id":"{}","status":"{status}","country":"{}","amount":"{}.{:02}","updated_at":"{}","source":"{}"}}"#,
            order_id(k),
            COUNTRIES[c],
            cents / 100,
            cents % 100,
            rfc3339_ms(at_ms),
            self.rng.pick(&["checkout", "payments", "warehouse"]),
        ))
    }

    /// A payment attempt for order `n` at `at_ms`.
    pub fn payment(&mut self, n: u64, at_ms: i64) -> String {
        self.payment_for(n, &format!("ord-{n:010}"), at_ms)
    }

    /// Payment `n`, an attempt to pay order `order_id` at `at_ms`.
    pub fn payment_for(&mut self, n: u64, order_id: &str, at_ms: i64) -> String {
        let cents = 500 + self.rng.below(49_500);
        let m = self.rng.below(METHODS.len() as u64) as usize;
        let ok = self.rng.below(1000) < METHOD_SUCCESS[m];
        format!(
            r#"{{"payment_id":"pay-{n:010}","order_id":"{order_id}","amount":{}.{:02},"method":"{}","status":"{}","attempted_at":{at_ms}}}"#,
            cents / 100,
            cents % 100,
            METHODS[m],
            if ok { "succeeded" } else { "failed" },
        )
    }

    /// A sensor reading at `at_ms`.
    pub fn reading(&mut self, n: u64, at_ms: i64) -> String {
        let site = self.rng.below(SITES.len() as u64);
        let temp = 150 + self.rng.below(200) as i64 + site as i64 * 10;
        format!(
            r#"{{"sensor_id":"sen-{:04}","site":"{}","temperature":{}.{},"humidity":{}.{},"reported_at":"{}"}}"#,
            sensor_of(n, at_ms),
            SITES[site as usize],
            temp / 10,
            temp % 10,
            30 + self.rng.below(60),
            self.rng.below(10),
            rfc3339_ms(at_ms),
        )
    }

    /// The event of `topic` (orders, payments, readings, order_status); other topics get an
    /// order. An order status event that is a tombstone ([`status_event`] `n` erases its
    /// order) is given as the order's previous status (see [`Self::status_change`]).
    pub fn event(&mut self, topic: &str, n: u64, at_ms: i64) -> String {
        match topic {
            "payments" => self.payment(n, at_ms),
            "readings" => self.reading(n, at_ms),
            ORDER_STATUS_TOPIC => {
                let (k, step) = status_event(n);
                self.status_change(k, step, at_ms)
                    .or_else(|| self.status_change(k, 1, at_ms))
                    .unwrap_or_default()
            }
            _ => self.order(n, at_ms),
        }
    }

    /// A bad record of one of the rejected kinds, chosen by `which`.
    pub fn bad_record(&mut self, which: u64, mut base: SourceRecord) -> SourceRecord {
        match which % 8 {
            0 => base.value = Some(b"{\"order_id\": \"ord-broken\", \"amount\": ".to_vec()),
            1 => base.value = None,
            2 => base.value = Some(Vec::new()),
            3 => base.value = Some(b"[1, 2, 3]".to_vec()),
            4 => base.value = Some(vec![b'{', 0xff, 0xfe, b'}']),
            5 => base.raw_value_field = Some("%%% not base64 %%%".into()),
            6 => {
                base.value = Some(
                    br#"{"order_id":"ord-x","payment_id":"pay-x","sensor_id":"sen-x","amount":"12.5.0","created_at":"yesterday","attempted_at":"yesterday","reported_at":"yesterday"}"#.to_vec(),
                )
            }
            _ => base.value = Some(br#"{"note":"required fields missing"}"#.to_vec()),
        }
        base
    }
}
