//! Protobuf records behind a schema registry: the `.proto` schema the header names, compiled
//! once per schema id (protox), the message type picked by the framing's message index, the body
//! decoded with prost-reflect, and the spec's columns read from it by path.
//!
//! Message selection: Confluent frames carry message indexes after the schema id (a zig-zag
//! count, then zig-zag indexes into the file's messages and their nested messages; a single `0`
//! means the first message); Glue frames carry one varint index into all of the file's messages
//! (nested ones included) sorted by full name.
//!
//! Values: a field with presence (`optional`, message fields, oneof members, proto2) that is not
//! set is NULL; a proto3 field without presence that is not set has its default (0, "", false),
//! as every protobuf reader sees it. Enums land as their value's name in `string` columns (as
//! their number in integer columns); `google.protobuf.Timestamp` fills `timestamp` columns.

use std::borrow::Cow;

use prost_reflect::{
    DescriptorPool, DynamicMessage, Kind, MessageDescriptor, ReflectMessage, Value,
};

use super::framing::{SchemaCache, SchemaId, body, frame};
use super::value::{
    MAX_DATE_DAYS, MIN_DATE_DAYS, TIME_RANGE, parse_decimal, parse_timestamp, timestamp_in_range,
};
use super::{Cell, RegistryDecoder, RejectKind, Rejection};
use crate::spec::{ColumnType, TableSpec};

/// Name the registry's schema is compiled under.
const SCHEMA_FILE: &str = "schema.proto";

#[derive(Debug)]
struct Column {
    name: String,
    path: Vec<String>,
    shown: String,
    ty: ColumnType,
    required: bool,
}

/// A compiled `.proto` schema: its messages as Confluent indexes and Glue indexes find them.
#[derive(Debug)]
pub struct Compiled {
    /// Top-level messages in file order.
    top: Vec<MessageDescriptor>,
    /// Every message, nested ones included, sorted by full name (Glue's index).
    sorted: Vec<MessageDescriptor>,
}

/// Decodes registry-framed Protobuf values for one table.
#[derive(Debug)]
pub struct ProtobufDecoder {
    columns: Vec<Column>,
    schemas: SchemaCache<Compiled>,
}

impl ProtobufDecoder {
    /// A decoder for the table's columns (looked up in the message by their paths).
    pub fn new(table: &TableSpec) -> ProtobufDecoder {
        ProtobufDecoder {
            columns: table
                .leaves()
                .iter()
                .map(|c| Column {
                    name: c.name.clone(),
                    path: c.path.0.clone(),
                    shown: c.path.to_string(),
                    ty: c.column_type,
                    required: c.required,
                })
                .collect(),
            schemas: SchemaCache::default(),
        }
    }

    /// Decodes one framed value into its cells, one per column in spec order.
    pub fn decode<'a>(
        &self,
        value: &'a [u8],
        scratch: &'a mut Vec<u8>,
        max_bytes: usize,
    ) -> Result<Vec<Cell<'a>>, Rejection> {
        let framed = frame(value)?;
        let id = framed.id;
        let compiled = self.schemas.get(&id)?;
        let data = body(&framed, scratch, max_bytes)?;
        let mismatch = |m: String| {
            Rejection::new(
                RejectKind::SchemaMismatch,
                format!("payload does not match {id}: {m}"),
            )
        };
        let mut cursor = data;
        let message = match id {
            SchemaId::Confluent(_) => {
                let indexes = confluent_indexes(&mut cursor).map_err(mismatch)?;
                pick_confluent(&compiled, &indexes)
            }
            SchemaId::Glue(_) => {
                let index = varint(&mut cursor).map_err(mismatch)?;
                usize::try_from(index)
                    .ok()
                    .and_then(|i| compiled.sorted.get(i).cloned())
                    .ok_or_else(|| format!("message index {index} is not in the schema"))
            }
        }
        .map_err(mismatch)?;
        let msg = DynamicMessage::decode(message.clone(), cursor)
            .map_err(|e| mismatch(format!("{} does not decode: {e}", message.full_name())))?;
        let mut cells = Vec::with_capacity(self.columns.len());
        for c in &self.columns {
            let cell = self.column(&msg, c, &id)?;
            if c.required && cell == Cell::Null {
                return Err(Rejection::new(
                    RejectKind::MissingField,
                    format!(
                        "required column {} ({}) is missing or not set in a {} of {id}",
                        c.name,
                        c.shown,
                        message.full_name()
                    ),
                ));
            }
            cells.push(cell);
        }
        Ok(cells)
    }

    /// The cell of column `c` in `msg` (walking nested messages along its path).
    fn column<'a>(
        &self,
        msg: &DynamicMessage,
        c: &Column,
        id: &SchemaId,
    ) -> Result<Cell<'a>, Rejection> {
        let wrong = |detail: String| {
            Rejection::new(
                RejectKind::WrongType,
                format!(
                    "column {} ({}): {detail} ({id}); change the column's type in the spec or the producer's schema",
                    c.name, c.shown
                ),
            )
        };
        let mut current = msg;
        let Some((leaf, parents)) = c.path.split_last() else {
            return Ok(Cell::Null);
        };
        for part in parents {
            let Some(field) = current.descriptor().get_field_by_name(part) else {
                return Ok(Cell::Null);
            };
            if field.supports_presence() && !current.has_field(&field) {
                return Ok(Cell::Null);
            }
            // A set message field is borrowed, never copied; an unset one has no columns.
            match current.get_field(&field) {
                Cow::Borrowed(Value::Message(m)) => current = m,
                Cow::Owned(Value::Message(_)) => return Ok(Cell::Null),
                _ => {
                    return Err(wrong(format!(
                        "{part} is not a message, but the spec reads fields inside it"
                    )));
                }
            }
        }
        let Some(field) = current.descriptor().get_field_by_name(leaf) else {
            return Ok(Cell::Null);
        };
        if field.supports_presence() && !current.has_field(&field) {
            return Ok(Cell::Null);
        }
        let value = current.get_field(&field);
        to_cell(&value, &field.kind(), c.ty).map_err(|e| match e {
            CellError::Wrong(d) => wrong(d),
            CellError::Value(kind, d) => {
                Rejection::new(kind, format!("column {} ({}): {d}", c.name, c.shown))
            }
        })
    }
}

enum CellError {
    Wrong(String),
    Value(RejectKind, String),
}

fn kind_name(kind: &Kind) -> String {
    match kind {
        Kind::Message(m) => format!("message {}", m.full_name()),
        Kind::Enum(e) => format!("enum {}", e.full_name()),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn to_cell<'a>(value: &Value, kind: &Kind, col: ColumnType) -> Result<Cell<'a>, CellError> {
    use ColumnType as C;
    let out_of_range = |d: String| CellError::Value(RejectKind::OutOfRange, d);
    let int = |v: i128| -> Result<Cell<'a>, CellError> {
        match col {
            C::Int => i32::try_from(v)
                .map(Cell::Int)
                .map_err(|_| out_of_range(format!("{v} does not fit an int"))),
            C::Long => i64::try_from(v)
                .map(Cell::Long)
                .map_err(|_| out_of_range(format!("{v} does not fit a long"))),
            C::Float => Ok(Cell::Float(v as f32)),
            C::Double => Ok(Cell::Double(v as f64)),
            C::Decimal { precision, .. } => {
                let text = v.to_string();
                parse_decimal(&text, precision, col_scale(col))
                    .map(Cell::Decimal)
                    .map_err(|e| CellError::Value(e.kind, e.detail))
            }
            _ => Err(CellError::Wrong(format!(
                "the message has {}, which does not fit a {col} column",
                kind_name(kind)
            ))),
        }
    };
    let wrong = || {
        CellError::Wrong(format!(
            "the message has {}, which does not fit a {col} column",
            kind_name(kind)
        ))
    };
    match (value, col) {
        (Value::String(s), C::String) => Ok(Cell::Str(Cow::Owned(s.clone()))),
        (Value::String(s), C::Timestamp) => parse_timestamp(s)
            .map(Cell::Timestamp)
            .map_err(|e| CellError::Value(e.kind, e.detail)),
        (Value::String(s), C::Decimal { precision, scale }) => {
            parse_decimal(s.trim(), precision, scale)
                .map(Cell::Decimal)
                .map_err(|e| CellError::Value(e.kind, e.detail))
        }
        (Value::Bytes(b), C::String) => std::str::from_utf8(b)
            .map(|s| Cell::Str(Cow::Owned(s.to_string())))
            .map_err(|e| {
                CellError::Value(RejectKind::InvalidUtf8, format!("bytes are not UTF-8: {e}"))
            }),
        (Value::Bool(b), C::Boolean) => Ok(Cell::Bool(*b)),
        (Value::I32(v), C::Date) => {
            if (MIN_DATE_DAYS..=MAX_DATE_DAYS).contains(v) {
                Ok(Cell::Date(*v))
            } else {
                Err(out_of_range(format!(
                    "date {v} (days since 1970-01-01) is outside {TIME_RANGE}"
                )))
            }
        }
        (Value::I64(ms), C::Timestamp) => {
            let us = ms.checked_mul(1000).unwrap_or(i64::MAX);
            timestamp_in_range(us, format_args!("{ms} (epoch milliseconds)"))
                .map(Cell::Timestamp)
                .map_err(|e| CellError::Value(e.kind, e.detail))
        }
        (Value::I32(v), _) if col != C::Date => int(i128::from(*v)),
        (Value::I64(v), _) => int(i128::from(*v)),
        (Value::U32(v), _) => int(i128::from(*v)),
        (Value::U64(v), _) => int(i128::from(*v)),
        (Value::F32(v), C::Float) if v.is_finite() => Ok(Cell::Float(*v)),
        (Value::F32(v), C::Double) if v.is_finite() => Ok(Cell::Double(f64::from(*v))),
        (Value::F64(v), C::Double) if v.is_finite() => Ok(Cell::Double(*v)),
        (Value::F64(v), C::Float) if v.is_finite() => {
            if v.abs() > f64::from(f32::MAX) {
                Err(out_of_range(format!("{v} does not fit a float")))
            } else {
                Ok(Cell::Float(*v as f32))
            }
        }
        (Value::F32(_) | Value::F64(_), C::Float | C::Double) => {
            Err(out_of_range("not a finite number".into()))
        }
        (Value::EnumNumber(n), C::String) => match kind {
            Kind::Enum(e) => Ok(Cell::Str(Cow::Owned(
                e.get_value(*n)
                    .map_or_else(|| n.to_string(), |v| v.name().to_string()),
            ))),
            _ => Err(wrong()),
        },
        (Value::EnumNumber(n), C::Int | C::Long) => int(i128::from(*n)),
        (Value::Message(m), C::Timestamp)
            if m.descriptor().full_name() == "google.protobuf.Timestamp" =>
        {
            let seconds = match m.get_field_by_name("seconds").as_deref() {
                Some(Value::I64(s)) => *s,
                _ => 0,
            };
            let nanos = match m.get_field_by_name("nanos").as_deref() {
                Some(Value::I32(n)) => *n,
                _ => 0,
            };
            let us = seconds
                .checked_mul(1_000_000)
                .and_then(|s| s.checked_add(i64::from(nanos) / 1000))
                .unwrap_or(i64::MAX);
            timestamp_in_range(us, format_args!("{seconds}s {nanos}ns"))
                .map(Cell::Timestamp)
                .map_err(|e| CellError::Value(e.kind, e.detail))
        }
        _ => Err(wrong()),
    }
}

fn col_scale(col: ColumnType) -> u8 {
    match col {
        ColumnType::Decimal { scale, .. } => scale,
        _ => 0,
    }
}

/// A base-128 varint (unsigned), advancing `buf`.
fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut v: u64 = 0;
    for (i, b) in buf.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *buf = &buf[i + 1..];
            return Ok(v);
        }
    }
    Err("the message index is not a valid varint".into())
}

fn zigzag(buf: &mut &[u8]) -> Result<i64, String> {
    let v = varint(buf)?;
    Ok((v >> 1) as i64 ^ -((v & 1) as i64))
}

/// Confluent's message indexes: a count, then that many indexes (`[0]` when the count is 0).
fn confluent_indexes(buf: &mut &[u8]) -> Result<Vec<usize>, String> {
    let count = zigzag(buf)?;
    if count == 0 {
        return Ok(vec![0]);
    }
    if !(1..=64).contains(&count) {
        return Err(format!("{count} message indexes"));
    }
    (0..count)
        .map(|_| {
            let i = zigzag(buf)?;
            usize::try_from(i).map_err(|_| format!("message index {i}"))
        })
        .collect()
}

fn pick_confluent(compiled: &Compiled, indexes: &[usize]) -> Result<MessageDescriptor, String> {
    let shown = || format!("message indexes {indexes:?} are not in the schema");
    let (first, rest) = indexes.split_first().ok_or_else(shown)?;
    let mut message = compiled.top.get(*first).cloned().ok_or_else(shown)?;
    for i in rest {
        let child = message.child_messages().nth(*i);
        message = child.ok_or_else(shown)?;
    }
    Ok(message)
}

impl Compiled {
    /// The file's first top-level message.
    pub fn first_message(&self) -> Option<MessageDescriptor> {
        self.top.first().cloned()
    }

    /// The message of this full name (nested ones included).
    pub fn message(&self, full_name: &str) -> Option<MessageDescriptor> {
        self.sorted
            .iter()
            .find(|m| m.full_name() == full_name)
            .cloned()
    }

    /// Every message's full name, sorted.
    pub fn message_names(&self) -> Vec<String> {
        self.sorted
            .iter()
            .map(|m| m.full_name().to_string())
            .collect()
    }
}

/// Largest `.proto` source a registry may hand over, bytes.
pub(crate) const MAX_PROTO_BYTES: usize = 1024 * 1024;
/// Deepest nesting of `{`, `(`, `[` and `<` a `.proto` may have (messages in messages, option
/// values in text format, which nest with `{}` or `<>`): the compiler recurses on it, and a
/// source nested thousands deep would overflow the stack and abort the process.
pub(crate) const MAX_PROTO_NESTING: usize = 64;

/// Stack of the thread a `.proto` is compiled on: ample for [`MAX_PROTO_NESTING`] levels
/// whatever construct nests, so no schema reaches the process's own stack's end.
const COMPILE_STACK_BYTES: usize = 64 * 1024 * 1024;

/// Refuses `.proto` source over [`MAX_PROTO_BYTES`] or nested deeper than
/// [`MAX_PROTO_NESTING`], before the compiler sees it.
///
/// The count does not trust its own reading of comments and strings: an opening bracket counts
/// wherever it is, and a closing one inside a comment or string cancels only an opening one of
/// that same comment or string (so `message a { // }` nests, and a comment's balanced example
/// does not). Whatever the scan takes for a comment or a string, the compiler cannot nest
/// deeper than counted.
pub(crate) fn check_limits(text: &str) -> Result<(), String> {
    if text.len() > MAX_PROTO_BYTES {
        return Err(format!(
            "the .proto is {} bytes, over the limit of {MAX_PROTO_BYTES}",
            text.len()
        ));
    }
    let b = text.as_bytes();
    let too_deep = || {
        Err(format!(
            "the .proto nests more than {MAX_PROTO_NESTING} levels deep (the limit)"
        ))
    };
    // `depth`: brackets open in code; `carried`: opened in comments and strings, never closed.
    let (mut i, mut depth, mut carried) = (0usize, 0usize, 0usize);
    // A comment or string from `i` to `end` (exclusive): its brackets, as described above.
    let segment = |from: usize, end: usize, depth: usize, carried: &mut usize| {
        let mut local = 0usize;
        for c in &b[from..end.min(b.len())] {
            match c {
                b'{' | b'(' | b'[' | b'<' => {
                    local += 1;
                    if depth + *carried + local > MAX_PROTO_NESTING {
                        return Err(());
                    }
                }
                b'}' | b')' | b']' | b'>' => local = local.saturating_sub(1),
                _ => {}
            }
        }
        *carried += local;
        Ok(())
    };
    while i < b.len() {
        let start = i;
        match b[i] {
            // Line comments: `//`, and `#` (which the compiler's lexer takes as one too).
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                if segment(start, i, depth, &mut carried).is_err() {
                    return too_deep();
                }
                continue;
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                if segment(start, i, depth, &mut carried).is_err() {
                    return too_deep();
                }
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i = (i + 2).min(b.len());
                if segment(start, i, depth, &mut carried).is_err() {
                    return too_deep();
                }
                continue;
            }
            // A string ends at its quote or at the end of its line, as the compiler reads it.
            q @ (b'"' | b'\'') => {
                i += 1;
                while i < b.len() && b[i] != q && b[i] != b'\n' {
                    if b[i] == b'\\' && b.get(i + 1).is_some_and(|c| *c != b'\n') {
                        i += 1;
                    }
                    i += 1;
                }
                if b.get(i) == Some(&q) {
                    i += 1;
                }
                if segment(start, i, depth, &mut carried).is_err() {
                    return too_deep();
                }
                continue;
            }
            // Identifiers and numbers, lexed as the compiler does (an octal literal with an 8
            // or 9 is refused there).
            c if c.is_ascii_alphanumeric()
                || c == b'_'
                || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) =>
            {
                i = words(b, i)?;
                continue;
            }
            b'{' | b'(' | b'[' | b'<' => {
                depth += 1;
                if depth + carried > MAX_PROTO_NESTING {
                    return too_deep();
                }
            }
            b'}' | b')' | b']' | b'>' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// Lexes the identifiers and numbers that follow each other from `i` (nothing between them) the
/// way the compiler's lexer cuts them — a number ends where its digits, fraction, exponent and
/// `f` suffix do, so `86F009` is a float and the number `009`, and `N6-048` an identifier, a
/// minus and `048` — and returns where they end. An octal literal with an 8 or 9 (`089`) is
/// refused: no number protobuf knows, and a token the lexer does not expect (a debug build
/// asserts; a fuzzer found it).
fn words(b: &[u8], mut i: usize) -> Result<usize, String> {
    let digits = |from: usize| {
        b.get(from..)
            .map_or(0, |r| r.iter().take_while(|c| c.is_ascii_digit()).count())
    };
    // The length of an exponent (`e5`, `E-05`) at `at`, 0 if there is none.
    let exponent = |at: usize| match (b.get(at), b.get(at + 1)) {
        (Some(b'e' | b'E'), Some(b'+' | b'-')) if b.get(at + 2).is_some_and(u8::is_ascii_digit) => {
            2 + digits(at + 2)
        }
        (Some(b'e' | b'E'), Some(d)) if d.is_ascii_digit() => 1 + digits(at + 1),
        _ => 0,
    };
    let suffix = |at: usize| usize::from(matches!(b.get(at), Some(b'f' | b'F')));
    loop {
        let Some(&c) = b.get(i) else {
            return Ok(i);
        };
        if c.is_ascii_alphabetic() || c == b'_' {
            i += b[i..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
                .count();
        } else if c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            let j = i + 1 + digits(i + 1);
            let j = j + exponent(j);
            i = j + suffix(j);
        } else if c == b'0'
            && matches!(b.get(i + 1), Some(b'x' | b'X'))
            && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
        {
            i += 2 + b[i + 2..]
                .iter()
                .take_while(|c| c.is_ascii_hexdigit())
                .count();
        } else if c.is_ascii_digit() {
            let n = digits(i);
            let end = i + n;
            if b.get(end) == Some(&b'.') {
                let j = end + 1 + digits(end + 1);
                let j = j + exponent(j);
                i = j + suffix(j);
            } else if exponent(end) > 0 {
                let j = end + exponent(end);
                i = j + suffix(j);
            } else {
                if c == b'0' && b[i + 1..end].iter().any(|d| *d == b'8' || *d == b'9') {
                    return Err(format!(
                        "the .proto has an octal number with a digit 8 or 9 (at byte {i}), which is no number"
                    ));
                }
                // `0f` and `12f` are floats; after `017` an `f` begins an identifier.
                i = end + if c != b'0' || n == 1 { suffix(end) } else { 0 };
            }
        } else {
            return Ok(i);
        }
    }
}

/// Compiles `.proto` source (imports of Google's well-known types only), within the limits
/// (the limits this module checks) and on a thread with a stack of its own.
pub fn compile(text: &str) -> Result<Compiled, String> {
    check_limits(text)?;
    let text = text.to_string();
    std::thread::Builder::new()
        .name("proto-compile".into())
        .stack_size(COMPILE_STACK_BYTES)
        .spawn(move || compile_checked(&text))
        .map_err(|e| format!("no thread to compile the .proto on: {e}"))?
        .join()
        .map_err(|_| "the .proto compiler failed".to_string())?
}

fn compile_checked(text: &str) -> Result<Compiled, String> {
    let file = protox::file::File::from_source(SCHEMA_FILE, text).map_err(|e| e.to_string())?;
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(Single(file));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.open_file(SCHEMA_FILE).map_err(|e| e.to_string())?;
    let pool: DescriptorPool = compiler.descriptor_pool();
    let file = pool
        .get_file_by_name(SCHEMA_FILE)
        .ok_or("the schema compiled to no file")?;
    let top: Vec<MessageDescriptor> = file.messages().collect();
    let mut sorted = Vec::new();
    let mut queue: std::collections::VecDeque<MessageDescriptor> = top.iter().cloned().collect();
    while let Some(m) = queue.pop_front() {
        queue.extend(m.child_messages());
        sorted.push(m);
    }
    sorted.sort_by(|a, b| a.full_name().cmp(b.full_name()));
    Ok(Compiled { top, sorted })
}

/// A resolver that knows one file.
struct Single(protox::file::File);

impl protox::file::FileResolver for Single {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        if name == self.0.name() {
            Ok(self.0.clone())
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

impl RegistryDecoder for ProtobufDecoder {
    fn knows(&self, id: &SchemaId) -> bool {
        self.schemas.knows(id)
    }

    fn add_schema(&self, id: SchemaId, kind: &str, text: &str) {
        self.schemas.insert(id, kind, ("PROTOBUF", "protobuf"), || {
            compile(text).map_err(|e| {
                format!("{id}: the registry's .proto cannot be compiled (imports other than google/protobuf/* are not resolved): {e}")
            })
        });
    }

    fn add_missing(&self, id: SchemaId, reason: String) {
        self.schemas.add_missing(id, reason);
    }

    fn was_missing(&self, id: &SchemaId) -> bool {
        self.schemas.was_missing(id)
    }
}

#[cfg(test)]
mod tests;
