//! The HyperLogLog sketch behind `approx_distinct` in windows: mergeable across Kafka
//! partitions and corrections, and stored in the layout Athena (Trino) reads as a
//! `HyperLogLog` (Airlift's dense v2 layout, 2048 buckets, standard error 2.3% as Athena's
//! own `approx_distinct`).
//!
//! The layout (little-endian): format tag `3`, the index bit length `p` (11), a baseline
//! (the least register), one 4-bit delta per bucket (even buckets in the high nibble), the
//! number of overflow entries (u16), their bucket indexes (u16 each, ascending), their values
//! (one byte each: the register minus the baseline minus 15). Values are hashed with xxHash64
//! (seed 0) of their canonical bytes; a bucket is the hash's top `p` bits, its register one
//! more than the leading zeros of the rest. So a partial row's sketch merges with every other
//! partial row's by taking the per-bucket maximum: in Athena as
//! `cardinality(merge(CAST(from_base64(s) AS HyperLogLog)))`, in `streamtable query` by
//! [`Sketch::merge`]. Sketches merge only with sketches streamtable wrote (Athena's own
//! `approx_set` hashes differently).
//!
//! The estimate is Ertl's improved raw estimator ("New cardinality estimation algorithms for
//! HyperLogLog sketches", 2017), which needs no bias tables; Athena's `cardinality` applies its
//! own bias correction, so the two can differ within the sketch's error.

use std::fmt;

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::value::Value;

/// The aggregate `streamtable query`'s views merge sketch columns with (the estimated count of
/// the union).
pub const MERGE_SKETCHES: &str = "streamtable_merge_sketches";

/// Index bits: 2^11 = 2048 buckets.
pub const INDEX_BITS: u8 = 11;
const BUCKETS: usize = 1 << INDEX_BITS;
/// Airlift's format tag of the dense v2 layout.
const DENSE_V2: u8 = 3;
const MAX_DELTA: u8 = 15;

/// Non-zero registers a sketch keeps as (bucket, value) pairs before it turns dense: 3 bytes a
/// pair against 2048 bytes dense, so an open window with few distinct values (most of them)
/// costs a few hundred bytes, not 2 KB.
pub const SPARSE_LIMIT: usize = 256;

/// The registers: sparse (the non-zero ones, sorted by bucket) until they are many, then dense.
#[derive(Clone)]
enum Registers {
    Sparse(Vec<(u16, u8)>),
    Dense(Box<[u8]>),
}

/// A HyperLogLog sketch of 2048 registers.
#[derive(Clone)]
pub struct Sketch {
    registers: Registers,
}

impl Default for Sketch {
    fn default() -> Self {
        Sketch {
            registers: Registers::Sparse(Vec::new()),
        }
    }
}

impl PartialEq for Sketch {
    fn eq(&self, other: &Sketch) -> bool {
        self.dense() == other.dense()
    }
}

impl Eq for Sketch {}

impl fmt::Debug for Sketch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sketch(~{})", self.estimate())
    }
}

/// The 64-bit hash of a value: xxHash64, seed 0, of its canonical bytes (`None` for NULL).
pub fn hash(cell: &Value) -> Option<u64> {
    let h = |b: &[u8]| xxhash_rust::xxh64::xxh64(b, 0);
    Some(match cell {
        Value::Null => return None,
        Value::Bool(b) => h(&[u8::from(*b)]),
        Value::Int(v) => h(&v.to_le_bytes()),
        Value::Float(bits) => h(&bits.to_le_bytes()),
        Value::Str(s) => h(s.as_bytes()),
        Value::Dec(v) => h(&v.to_le_bytes()),
    })
}

/// A hash's bucket (its top bits) and register value (one more than the leading zeros of the
/// rest).
fn slot(hash: u64) -> (usize, u8) {
    let bucket = (hash >> (64 - u32::from(INDEX_BITS))) as usize;
    let rest = (hash << INDEX_BITS) | (1u64 << (INDEX_BITS - 1));
    (bucket, rest.leading_zeros() as u8 + 1)
}

impl Sketch {
    /// The sketch of `values` (NULLs skipped).
    pub fn of<'a>(values: impl IntoIterator<Item = &'a Value>) -> Sketch {
        let mut s = Sketch::default();
        for v in values {
            s.insert(v);
        }
        s
    }

    /// Adds a value; whether the sketch changed.
    pub fn insert(&mut self, value: &Value) -> bool {
        hash(value).is_some_and(|h| self.insert_hash(h))
    }

    /// The register of `bucket`.
    fn get(&self, bucket: usize) -> u8 {
        match &self.registers {
            Registers::Dense(r) => r.get(bucket).copied().unwrap_or(0),
            Registers::Sparse(pairs) => pairs
                .binary_search_by_key(&(bucket as u16), |(b, _)| *b)
                .map_or(0, |i| pairs[i].1),
        }
    }

    /// Raises the register of `bucket` to `value` (which is higher than it).
    fn set(&mut self, bucket: usize, value: u8) {
        match &mut self.registers {
            Registers::Dense(r) => {
                if let Some(slot) = r.get_mut(bucket) {
                    *slot = value;
                }
            }
            Registers::Sparse(pairs) => {
                match pairs.binary_search_by_key(&(bucket as u16), |(b, _)| *b) {
                    Ok(i) => pairs[i].1 = value,
                    Err(i) => pairs.insert(i, (bucket as u16, value)),
                }
                if pairs.len() > SPARSE_LIMIT {
                    self.registers = Registers::Dense(self.dense().into_boxed_slice());
                }
            }
        }
    }

    /// All 2048 registers.
    fn dense(&self) -> Vec<u8> {
        match &self.registers {
            Registers::Dense(r) => r.to_vec(),
            Registers::Sparse(pairs) => {
                let mut r = vec![0; BUCKETS];
                for &(b, v) in pairs {
                    if let Some(slot) = r.get_mut(usize::from(b)) {
                        *slot = v;
                    }
                }
                r
            }
        }
    }

    /// A sketch of `registers` (2048), sparse when few are set.
    fn of_registers(registers: Vec<u8>) -> Sketch {
        let set = registers.iter().filter(|r| **r > 0).count();
        let registers = if set <= SPARSE_LIMIT {
            Registers::Sparse(
                registers
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| **r > 0)
                    .map(|(b, r)| (b as u16, *r))
                    .collect(),
            )
        } else {
            Registers::Dense(registers.into_boxed_slice())
        };
        Sketch { registers }
    }

    /// Whether the sketch keeps its registers sparse (memory: a few bytes a set register).
    pub fn is_sparse(&self) -> bool {
        matches!(self.registers, Registers::Sparse(_))
    }

    /// Adds a hash; whether the sketch changed.
    pub fn insert_hash(&mut self, hash: u64) -> bool {
        let (bucket, value) = slot(hash);
        if value > self.get(bucket) {
            self.set(bucket, value);
            true
        } else {
            false
        }
    }

    /// The sketch with `value` added, if that changes it (one hash, no copy otherwise).
    pub fn inserted(&self, value: &Value) -> Option<Sketch> {
        let (bucket, v) = slot(hash(value)?);
        (v > self.get(bucket)).then(|| {
            let mut s = self.clone();
            s.set(bucket, v);
            s
        })
    }

    /// Merges `other` into this sketch (the sketch of the union).
    pub fn merge(&mut self, other: &Sketch) {
        match &other.registers {
            Registers::Sparse(pairs) => {
                for &(b, v) in pairs {
                    if v > self.get(usize::from(b)) {
                        self.set(usize::from(b), v);
                    }
                }
            }
            Registers::Dense(theirs) => {
                let mut mine = self.dense();
                for (a, b) in mine.iter_mut().zip(theirs.iter()) {
                    *a = (*a).max(*b);
                }
                self.registers = Registers::Dense(mine.into_boxed_slice());
            }
        }
    }

    /// The estimated number of distinct values.
    pub fn estimate(&self) -> i64 {
        let m = BUCKETS as f64;
        let q = 64 - usize::from(INDEX_BITS);
        let mut histogram = vec![0u32; q + 2];
        for &r in self.dense().iter() {
            histogram[usize::from(r).min(q + 1)] += 1;
        }
        if histogram[0] as usize == BUCKETS {
            return 0;
        }
        let mut z = m * tau(1.0 - f64::from(histogram[q + 1]) / m);
        for k in (1..=q).rev() {
            z = 0.5 * (z + f64::from(histogram[k]));
        }
        z += m * sigma(f64::from(histogram[0]) / m);
        let alpha = 1.0 / (2.0 * std::f64::consts::LN_2);
        (alpha * m * m / z).round() as i64
    }

    /// Airlift's dense v2 serialization (what Athena casts to `HyperLogLog`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let registers = self.dense();
        let baseline = registers.iter().copied().min().unwrap_or(0);
        let mut out = Vec::with_capacity(5 + BUCKETS / 2);
        out.extend([DENSE_V2, INDEX_BITS, baseline]);
        let mut overflows = Vec::new();
        for (i, pair) in registers.chunks(2).enumerate() {
            let mut byte = 0u8;
            for (j, &r) in pair.iter().enumerate() {
                let delta = r - baseline;
                if delta > MAX_DELTA {
                    overflows.push(((2 * i + j) as u16, delta - MAX_DELTA));
                }
                byte |= delta.min(MAX_DELTA) << if j == 0 { 4 } else { 0 };
            }
            out.push(byte);
        }
        out.extend((overflows.len() as u16).to_le_bytes());
        for (bucket, _) in &overflows {
            out.extend(bucket.to_le_bytes());
        }
        out.extend(overflows.iter().map(|(_, v)| *v));
        out
    }

    /// Reads what [`Sketch::to_bytes`] writes (Airlift's dense v2 layout with 2048 buckets).
    pub fn from_bytes(bytes: &[u8]) -> Result<Sketch, String> {
        let [tag, p, baseline, rest @ ..] = bytes else {
            return Err(format!("a sketch of {} bytes is too short", bytes.len()));
        };
        if *tag != DENSE_V2 {
            return Err(format!(
                "sketch format {tag} is not the dense layout (3) streamtable writes"
            ));
        }
        if *p != INDEX_BITS {
            return Err(format!(
                "a sketch of 2^{p} buckets cannot merge with streamtable's 2^{INDEX_BITS}"
            ));
        }
        let (deltas, rest) = rest
            .split_at_checked(BUCKETS / 2)
            .ok_or("the sketch's buckets are cut short")?;
        let mut registers = Vec::with_capacity(BUCKETS);
        for &d in deltas {
            for delta in [d >> 4, d & 0x0f] {
                registers.push(baseline.saturating_add(delta));
            }
        }
        let [n0, n1, rest @ ..] = rest else {
            return Err("the sketch's overflow count is missing".into());
        };
        let n = usize::from(u16::from_le_bytes([*n0, *n1]));
        if rest.len() != 3 * n {
            return Err(format!(
                "the sketch declares {n} overflow entries but holds {} bytes for them",
                rest.len()
            ));
        }
        let (buckets, values) = rest.split_at(2 * n);
        for (b, &v) in buckets.chunks_exact(2).zip(values) {
            let bucket = usize::from(u16::from_le_bytes([b[0], b[1]]));
            let r = registers
                .get_mut(bucket)
                .ok_or_else(|| format!("overflow bucket {bucket} is out of range"))?;
            *r = r.saturating_add(v);
        }
        Ok(Sketch::of_registers(registers))
    }

    /// [`Sketch::to_bytes`] in base64: the value of a partial row's `…__hll` column.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.to_bytes())
    }

    /// Reads what [`Sketch::to_base64`] writes.
    pub fn from_base64(text: &str) -> Result<Sketch, String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| format!("a sketch is not base64: {e}"))?;
        Sketch::from_bytes(&bytes)
    }

    /// The raw registers (one byte per bucket), for merging in a query engine's state.
    pub fn registers(&self) -> Vec<u8> {
        self.dense()
    }

    /// A sketch from raw registers (what [`Sketch::registers`] gave).
    pub fn from_registers(registers: &[u8]) -> Result<Sketch, String> {
        if registers.len() != BUCKETS {
            return Err(format!(
                "{} registers; a sketch has {BUCKETS}",
                registers.len()
            ));
        }
        Ok(Sketch::of_registers(registers.to_vec()))
    }
}

fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let (mut y, mut z) = (1.0, x);
    loop {
        x *= x;
        let before = z;
        z += x * y;
        y += y;
        if z == before {
            return z;
        }
    }
}

fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let (mut y, mut z) = (1.0, 1.0 - x);
    loop {
        x = x.sqrt();
        let before = z;
        y *= 0.5;
        z -= (1.0 - x).powi(2) * y;
        if z == before {
            return z / 3.0;
        }
    }
}

impl Serialize for Sketch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_base64())
    }
}

impl<'de> Deserialize<'de> for Sketch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Sketch, D::Error> {
        let text = String::deserialize(d)?;
        Sketch::from_base64(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(range: std::ops::Range<i64>) -> Vec<Value> {
        range.map(|i| Value::Str(format!("customer-{i}"))).collect()
    }

    #[test]
    fn estimates_stay_within_the_standard_error() {
        for n in [1i64, 2, 10, 100, 1_000, 5_000, 20_000, 200_000] {
            let s = Sketch::of(&values(0..n));
            let error = (s.estimate() - n).abs() as f64 / n as f64;
            // 1.04 / sqrt(2048) = 2.3%; four standard errors, deterministic for these values.
            assert!(error <= 0.092, "n = {n}: estimate {}", s.estimate());
            if n <= 10 {
                assert!((s.estimate() - n).abs() <= 1, "n = {n}: {}", s.estimate());
            }
        }
        assert_eq!(Sketch::default().estimate(), 0);
        assert_eq!(Sketch::of(&[Value::Null]).estimate(), 0);
    }

    #[test]
    fn merged_sketches_are_the_sketch_of_the_union() {
        let all = values(0..3_000);
        let mut a = Sketch::of(&all[..2_000]);
        let b = Sketch::of(&all[1_000..]);
        a.merge(&b);
        assert_eq!(a, Sketch::of(&all));
        let copies: Vec<Value> = all.iter().chain(all.iter()).cloned().collect();
        assert_eq!(Sketch::of(&copies), Sketch::of(&all), "copies count once");
    }

    #[test]
    fn the_stored_layout_is_airlifts_dense_v2() {
        let mut s = Sketch::default();
        // Bucket 0 gets the largest register (all bits after the index zero: 64 - 11 + 1),
        // bucket 1 a register of 1, bucket 2048 - 1 a register of 2.
        assert!(s.insert_hash(0));
        assert!(s.insert_hash(1u64 << 53 | 1u64 << 52));
        assert!(s.insert_hash(u64::MAX ^ (1u64 << 52)));
        let bytes = s.to_bytes();
        assert_eq!(&bytes[..3], &[3, 11, 0], "tag, p, baseline");
        assert_eq!(
            bytes[3], 0xf1,
            "bucket 0 in the high nibble (15, overflowing), 1 low"
        );
        assert_eq!(bytes[3 + 1023], 0x02, "bucket 2047: the low nibble");
        assert_eq!(bytes.len(), 3 + 1024 + 2 + 3);
        assert_eq!(&bytes[1027..], &[1, 0, 0, 0, 54 - 15]);
        assert_eq!(Sketch::from_bytes(&bytes).unwrap(), s);
        // A full sketch has a baseline and no overflow.
        let full = Sketch::of(&values(0..100_000));
        let bytes = full.to_bytes();
        assert!(bytes[2] > 0, "baseline {}", bytes[2]);
        assert_eq!(Sketch::from_bytes(&bytes).unwrap(), full);
        assert_eq!(Sketch::from_base64(&full.to_base64()).unwrap(), full);
    }

    #[test]
    fn damaged_sketches_are_refused_with_the_reason() {
        let good = Sketch::of(&values(0..10)).to_bytes();
        for (bytes, why) in [
            (vec![], "too short"),
            (vec![2, 11, 0], "dense layout"),
            (vec![3, 12, 0], "2^12 buckets"),
            (good[..500].to_vec(), "cut short"),
            (good[..1027].to_vec(), "overflow count"),
            ([&good[..1027], &[1, 0][..]].concat(), "declares 1"),
            (
                [&good[..1027], &[1, 0, 0xff, 0xff, 1][..]].concat(),
                "out of range",
            ),
        ] {
            let e = Sketch::from_bytes(&bytes).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        assert!(Sketch::from_base64("%%").unwrap_err().contains("base64"));
        assert!(Sketch::from_registers(&[0; 3]).is_err());
    }

    #[test]
    fn values_of_every_type_hash_and_state_round_trips() {
        let cells = [
            Value::Bool(true),
            Value::Int(7),
            Value::Float(1.5f64.to_bits()),
            Value::Dec(12_345),
            Value::Str("x".into()),
        ];
        let s = Sketch::of(&cells);
        assert_eq!(s.estimate(), 5);
        assert!(s.inserted(&Value::Int(7)).is_none());
        assert!(s.inserted(&Value::Null).is_none());
        let more = s.inserted(&Value::Int(8)).expect("a new value");
        assert_eq!(
            more,
            Sketch::of(&[cells.as_slice(), &[Value::Int(8)]].concat())
        );
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Sketch>(&json).unwrap(), s);
        assert!(serde_json::from_str::<Sketch>("\"AAAA\"").is_err());
    }

    /// A sketch of few values keeps its registers sparse (a few bytes each, not 2 KB per open
    /// window and key), turns dense past SPARSE_LIMIT set registers, and both forms estimate,
    /// merge and serialize alike.
    #[test]
    fn sketches_stay_sparse_until_it_pays_to_go_dense() {
        let few: Vec<Value> = (0..50).map(Value::Int).collect();
        let small = Sketch::of(&few);
        assert!(small.is_sparse());
        let many: Vec<Value> = (0..5_000).map(Value::Int).collect();
        let big = Sketch::of(&many);
        assert!(!big.is_sparse());
        // A sparse and a dense sketch of the same registers are equal; bytes round-trip to
        // the same form.
        let dense_small = Sketch::from_registers(&small.registers()).expect("registers");
        assert_eq!(dense_small, small);
        assert!(
            Sketch::from_bytes(&small.to_bytes())
                .expect("bytes")
                .is_sparse()
        );
        assert!(
            !Sketch::from_bytes(&big.to_bytes())
                .expect("bytes")
                .is_sparse()
        );
        // Merging gives the sketch of the union whatever the forms.
        let mut merged = small.clone();
        merged.merge(&big);
        assert_eq!(
            merged,
            Sketch::of(&[few.as_slice(), many.as_slice()].concat())
        );
        let mut other = big.clone();
        other.merge(&small);
        assert_eq!(other, merged);
        assert_eq!(
            small.estimate(),
            Sketch::from_registers(&small.registers())
                .unwrap()
                .estimate()
        );
    }
}
