//! A bounds-checked cursor over one Avro body: varints, lengths, and skipping values the table
//! does not take. Nothing in a payload can make it read out of bounds, loop without progress or
//! recurse past [`MAX_DEPTH`].

use super::schema::{Schema, Type};
use crate::decode::RejectKind;
use crate::decode::value::ValueError;

/// Deepest nesting of records, arrays, maps and unions a payload may have.
pub(super) const MAX_DEPTH: usize = 64;

/// Values one body may make the reader visit: [`VISITS_PER_BYTE`] per byte of the body plus
/// [`VISITS_BASE`]. A value that takes no bytes (a `null`, a record of them) still costs a
/// visit, so a writer schema whose named records are reused as fields (each level doubling
/// the values of a record) cannot make a 7-byte body cost 2^k steps.
pub(super) const VISITS_PER_BYTE: usize = 16;
/// See [`VISITS_PER_BYTE`].
pub(super) const VISITS_BASE: usize = 4_096;

/// Why one value could not be read: the body is malformed, or the value does not fit.
pub(super) enum Fault {
    Malformed(String),
    Value(ValueError),
}

pub(super) fn value_error(kind: RejectKind, detail: String) -> Fault {
    Fault::Value(ValueError::new(kind, detail))
}

/// A bounds-checked reader over one body.
pub(super) struct Cursor<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
    /// Items (array, map entries) still allowed: bounds work on payloads of zero-sized items.
    pub budget: usize,
    /// Values still allowed to be visited (see [`VISITS_PER_BYTE`]).
    pub visits: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor over `buf` with the budgets a body of its length gets.
    pub(super) fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor {
            buf,
            pos: 0,
            budget: buf.len() + 1,
            visits: buf
                .len()
                .saturating_mul(VISITS_PER_BYTE)
                .saturating_add(VISITS_BASE),
        }
    }

    /// Counts one value visited; fails once the body's budget is spent.
    pub(super) fn visit(&mut self) -> Result<(), Fault> {
        match self.visits.checked_sub(1) {
            Some(left) => {
                self.visits = left;
                Ok(())
            }
            None => Err(Fault::Malformed(format!(
                "reading the record visits more than {} values for its {} bytes ({VISITS_PER_BYTE} per byte plus {VISITS_BASE}, the limit): the writer's schema nests records that hold no bytes",
                self.buf
                    .len()
                    .saturating_mul(VISITS_PER_BYTE)
                    .saturating_add(VISITS_BASE),
                self.buf.len()
            ))),
        }
    }

    fn eof(&self, what: &str) -> Fault {
        Fault::Malformed(format!(
            "payload ends inside {what} (byte {} of {})",
            self.pos,
            self.buf.len()
        ))
    }

    pub(super) fn byte(&mut self) -> Result<u8, Fault> {
        let b = *self.buf.get(self.pos).ok_or_else(|| self.eof("a value"))?;
        self.pos += 1;
        Ok(b)
    }

    /// A zig-zag varint `long` (an `int` is encoded the same way).
    pub(super) fn long(&mut self) -> Result<i64, Fault> {
        let mut v: u64 = 0;
        for shift in (0..70).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or_else(|| self.eof("a number"))?;
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(Fault::Malformed("varint longer than 64 bits".into()));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
            }
        }
        Err(Fault::Malformed("varint longer than 10 bytes".into()))
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], Fault> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        let Some(end) = end else {
            return Err(self.eof(&format!("{n} bytes")));
        };
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    pub(super) fn bytes(&mut self) -> Result<&'a [u8], Fault> {
        let n = self.long()?;
        let n = usize::try_from(n).map_err(|_| Fault::Malformed(format!("negative length {n}")))?;
        self.take(n)
    }

    pub(super) fn str(&mut self) -> Result<&'a str, Fault> {
        let b = self.bytes()?;
        std::str::from_utf8(b)
            .map_err(|e| value_error(RejectKind::InvalidUtf8, format!("string is not UTF-8: {e}")))
    }

    pub(super) fn float(&mut self) -> Result<f32, Fault> {
        let b = self.take(4)?;
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(super) fn double(&mut self) -> Result<f64, Fault> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(f64::from_le_bytes(a))
    }

    /// Skips one value of `ty`.
    pub(super) fn skip(&mut self, schema: &Schema, ty: &Type, depth: usize) -> Result<(), Fault> {
        self.visit()?;
        if depth > MAX_DEPTH {
            return Err(Fault::Malformed(format!(
                "nested more than {MAX_DEPTH} levels deep"
            )));
        }
        match ty {
            Type::Null => {}
            Type::Boolean => {
                self.byte()?;
            }
            Type::Int
            | Type::Long
            | Type::Date
            | Type::TimestampMillis
            | Type::TimestampMicros
            | Type::TimestampNanos
            | Type::TimeOfDay => {
                self.long()?;
            }
            Type::Enum(_) => {
                self.long()?;
            }
            Type::Float => {
                self.take(4)?;
            }
            Type::Double => {
                self.take(8)?;
            }
            Type::Bytes | Type::String | Type::Decimal { fixed: None, .. } => {
                self.bytes()?;
            }
            Type::Fixed(n) | Type::Decimal { fixed: Some(n), .. } => {
                self.take(*n)?;
            }
            Type::Record(i) => {
                let fields = schema.records.get(*i).map(|r| r.fields.as_slice());
                for f in fields.unwrap_or_default() {
                    self.skip(schema, &f.ty, depth + 1)?;
                }
            }
            Type::Union(branches) => {
                let i = self.long()?;
                let b = usize::try_from(i)
                    .ok()
                    .and_then(|i| branches.get(i))
                    .ok_or_else(|| Fault::Malformed(format!("union branch {i} does not exist")))?;
                self.skip(schema, b, depth + 1)?;
            }
            Type::Array(item) => self.skip_blocks(schema, item, None, depth)?,
            Type::Map(value) => self.skip_blocks(schema, value, Some(()), depth)?,
        }
        Ok(())
    }

    /// Skips an array's or a map's blocks (a map's entries start with a string key).
    fn skip_blocks(
        &mut self,
        schema: &Schema,
        item: &Type,
        keyed: Option<()>,
        depth: usize,
    ) -> Result<(), Fault> {
        loop {
            let count = self.long()?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                // A negative count is followed by the block's size in bytes.
                let size = self.long()?;
                let size = usize::try_from(size)
                    .map_err(|_| Fault::Malformed(format!("negative block size {size}")))?;
                self.take(size)?;
                continue;
            }
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            if count > self.budget {
                return Err(Fault::Malformed(format!(
                    "a block of {count} items is more than the payload can hold"
                )));
            }
            self.budget -= count;
            for _ in 0..count {
                if keyed.is_some() {
                    self.bytes()?;
                }
                self.skip(schema, item, depth + 1)?;
            }
        }
    }
}
