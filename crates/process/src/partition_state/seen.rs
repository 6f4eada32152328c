//! The packed layout of dedup keys in a stored partition state of layouts 2 and 3 (read to
//! migrate; written only by the tests): the part of the state that
//! grows with traffic (every key of the bound), written after the JSON of the rest. JSON per
//! key cost more than the batch itself; this is a length-prefixed binary list that zstd then
//! compresses as well as the JSON.
//!
//! Per table with keys: name (u16 length + UTF-8), entry count (u32), then per entry the number
//! of key cells (u8), the cells, and the first event time as a zigzag varint of its difference
//! to the previous entry's. A cell is a tag byte and its value: 0 NULL, 1 boolean (one byte),
//! 2 integer (zigzag varint), 3 float (8 bytes of `f64` bits), 4 string (varint length +
//! UTF-8), 5 decimal (16 bytes, unscaled), 6 (state layout 3) a string sharing a prefix with the
//! previous entry's string in the same position (varint prefix length, varint suffix length,
//! the suffix). Integers are little-endian. Keys are sorted, so neighbours share long prefixes
//! (`ord-0000012345`, `ord-0000012346`): front coding halves what zstd then has to compress.

use crate::error::{Error, Result};
use crate::value::Value;

/// Dedup keys with their first event time (µs), as [`super::TableState::seen`] holds them.
pub(super) type Keys = Vec<(Vec<Value>, i64)>;

#[cfg(test)]
/// Appends `tables`' keys (name, keys) to `out`.
pub(super) fn pack<'a>(
    tables: impl Iterator<Item = (&'a str, &'a [(Vec<Value>, i64)])>,
    out: &mut Vec<u8>,
) -> Result<()> {
    for (name, seen) in tables {
        let len = u16::try_from(name.len())
            .map_err(|_| Error::Internal(format!("table name {name:?} is too long for state")))?;
        out.extend(len.to_le_bytes());
        out.extend(name.as_bytes());
        let count = u32::try_from(seen.len())
            .map_err(|_| Error::Internal(format!("{name}: too many dedup keys for state")))?;
        out.extend(count.to_le_bytes());
        out.reserve(seen.len() * 8);
        let mut previous = 0i64;
        let mut previous_key: &[Value] = &[];
        for (key, time) in seen {
            let cells = u8::try_from(key.len()).map_err(|_| {
                Error::Internal(format!("{name}: a dedup key of {} columns", key.len()))
            })?;
            out.push(cells);
            for (j, c) in key.iter().enumerate() {
                let shared = match (c, previous_key.get(j)) {
                    (Value::Str(s), Some(Value::Str(p))) => shared_prefix(p, s),
                    _ => 0,
                };
                match c {
                    Value::Str(s) if shared >= MIN_PREFIX => {
                        out.push(6);
                        varint(shared as u64, out);
                        varint((s.len() - shared) as u64, out);
                        out.extend(&s.as_bytes()[shared..]);
                    }
                    _ => cell(c, out),
                }
            }
            varint(zigzag(time.wrapping_sub(previous)), out);
            previous = *time;
            previous_key = key;
        }
    }
    Ok(())
}

/// Reads what [`pack`] wrote: (table, keys) in order. `what` names the state in errors.
pub(super) fn unpack(mut bytes: &[u8], what: &str) -> Result<Vec<(String, Keys)>> {
    let bad = |m: &str| Error::Internal(format!("{what}: dedup keys in state are damaged ({m})"));
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = usize::from(u16::from_le_bytes(
            take::<2>(&mut bytes).ok_or_else(|| bad("name"))?,
        ));
        let name = take_slice(&mut bytes, len).ok_or_else(|| bad("name"))?;
        let name = std::str::from_utf8(name)
            .map_err(|_| bad("name"))?
            .to_string();
        let count = u32::from_le_bytes(take::<4>(&mut bytes).ok_or_else(|| bad("count"))?);
        let mut seen = Vec::with_capacity((count as usize).min(bytes.len()));
        let mut previous = 0i64;
        for _ in 0..count {
            let [cells] = take::<1>(&mut bytes).ok_or_else(|| bad("key"))?;
            let mut key = Vec::with_capacity(usize::from(cells));
            for j in 0..usize::from(cells) {
                let before = seen.last().and_then(|(k, _): &(Vec<Value>, i64)| k.get(j));
                key.push(read_cell(&mut bytes, before).ok_or_else(|| bad("cell"))?);
            }
            let delta = read_varint(&mut bytes).ok_or_else(|| bad("time"))?;
            previous = previous.wrapping_add(unzigzag(delta));
            seen.push((key, previous));
        }
        out.push((name, seen));
    }
    Ok(out)
}

#[cfg(test)]
fn cell(c: &Value, out: &mut Vec<u8>) {
    match c {
        Value::Null => out.push(0),
        Value::Bool(b) => out.extend([1, u8::from(*b)]),
        Value::Int(v) => {
            out.push(2);
            varint(zigzag(*v), out);
        }
        Value::Float(bits) => {
            out.push(3);
            out.extend(bits.to_le_bytes());
        }
        Value::Str(s) => {
            out.push(4);
            varint(s.len() as u64, out);
            out.extend(s.as_bytes());
        }
        Value::Dec(v) => {
            out.push(5);
            out.extend(v.to_le_bytes());
        }
    }
}

#[cfg(test)]
/// Strings sharing fewer leading bytes are written whole.
const MIN_PREFIX: usize = 2;

#[cfg(test)]
/// How many leading bytes `a` and `b` share (eight at a time, then one by one).
fn shared_prefix(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n && a[i..i + 8] == b[i..i + 8] {
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// A cell; `before` is the previous entry's cell in the same position (for tag 6).
fn read_cell(bytes: &mut &[u8], before: Option<&Value>) -> Option<Value> {
    let [tag] = take::<1>(bytes)?;
    Some(match tag {
        0 => Value::Null,
        1 => Value::Bool(take::<1>(bytes)?[0] != 0),
        2 => Value::Int(unzigzag(read_varint(bytes)?)),
        3 => Value::Float(u64::from_le_bytes(take::<8>(bytes)?)),
        4 => {
            let len = usize::try_from(read_varint(bytes)?).ok()?;
            let s = take_slice(bytes, len)?;
            Value::Str(std::str::from_utf8(s).ok()?.to_string())
        }
        5 => Value::Dec(i128::from_le_bytes(take::<16>(bytes)?)),
        6 => {
            let Some(Value::Str(p)) = before else {
                return None;
            };
            let shared = usize::try_from(read_varint(bytes)?).ok()?;
            let len = usize::try_from(read_varint(bytes)?).ok()?;
            let mut s = p.as_bytes().get(..shared)?.to_vec();
            s.extend_from_slice(take_slice(bytes, len)?);
            Value::Str(String::from_utf8(s).ok()?)
        }
        _ => return None,
    })
}

#[cfg(test)]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn read_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let [b] = take::<1>(bytes)?;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

fn take<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = bytes.split_first_chunk::<N>()?;
    *bytes = rest;
    Some(*head)
}

fn take_slice<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = bytes.split_at_checked(n)?;
    *bytes = rest;
    Some(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_cell() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Int),
            any::<u64>().prop_map(Value::Float),
            ".{0,20}".prop_map(Value::Str),
            any::<i128>().prop_map(Value::Dec),
        ]
    }

    proptest! {
        #[test]
        fn keys_round_trip(
            tables in proptest::collection::vec(
                ("[a-z_]{1,12}", proptest::collection::vec(
                    (proptest::collection::vec(any_cell(), 0..4), any::<i64>()), 0..20)),
                0..4),
        ) {
            let mut bytes = Vec::new();
            pack(tables.iter().map(|(n, s)| (n.as_str(), s.as_slice())), &mut bytes).unwrap();
            prop_assert_eq!(unpack(&bytes, "t").unwrap(), tables);
        }

        #[test]
        fn damaged_bytes_are_an_error_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = unpack(&bytes, "t");
        }
    }

    #[test]
    fn neighbours_share_prefixes_even_inside_a_character() {
        let key = |s: &str| vec![Value::Str(s.into()), Value::Int(1)];
        // "é" and "è" share their first UTF-8 byte: the prefix ends inside a character.
        let seen = vec![
            (key("ord-0000012345"), 10),
            (key("ord-0000012346"), 11),
            (key("ord-é"), 12),
            (key("ord-è"), 13),
            (key("x"), 14),
            (vec![Value::Null], 15),
            (key("xy"), 16),
        ];
        let mut bytes = Vec::new();
        pack([("t", seen.as_slice())].into_iter(), &mut bytes).unwrap();
        assert_eq!(
            unpack(&bytes, "t").unwrap(),
            vec![("t".to_string(), seen.clone())]
        );
        // The second key is its 13 shared bytes' count and its last byte, not 14 bytes again.
        assert!(bytes.windows(4).any(|w| w == [6, 13, 1, b'6']), "{bytes:?}");
        // A prefix with no string before it is damage, not a panic.
        assert!(unpack(&[1, 0, b't', 1, 0, 0, 0, 1, 6, 3, 0, 0], "t").is_err());
    }

    #[test]
    fn truncation_is_named() {
        let mut bytes = Vec::new();
        let seen = vec![(vec![Value::Str("order-1".into())], 1_700_000_000_000_000)];
        pack([("orders_clean", seen.as_slice())].into_iter(), &mut bytes).unwrap();
        let e = unpack(&bytes[..bytes.len() - 1], "partition orders/0").unwrap_err();
        assert!(
            e.to_string().contains("partition orders/0: dedup keys"),
            "{e}"
        );
    }
}
