//! Schema registry framings: the header before a record's body that names the writer's schema.
//!
//! Two framings, told apart by their first byte:
//! - Confluent: magic byte `0`, then the schema id as 4 bytes big-endian, then (Protobuf only)
//!   the message indexes, then the body;
//! - AWS Glue Schema Registry: header version `3`, compression (`0` none, `5` zlib), the schema
//!   version's UUID (16 bytes), then the body (compressed or not; Protobuf: a message index
//!   first).

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::sync::{Arc, RwLock};

use super::{RejectKind, Rejection};

/// Which schema a record says it was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SchemaId {
    /// A Confluent Schema Registry id.
    Confluent(u32),
    /// An AWS Glue Schema Registry schema version id.
    Glue(uuid::Uuid),
}

impl fmt::Display for SchemaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaId::Confluent(id) => write!(f, "Confluent schema id {id}"),
            SchemaId::Glue(id) => write!(f, "Glue schema version {id}"),
        }
    }
}

/// Confluent wire format: magic byte.
pub const CONFLUENT_MAGIC: u8 = 0;
/// Glue Schema Registry wire format: header version byte.
pub const GLUE_HEADER_VERSION: u8 = 3;
/// Glue: body not compressed.
pub const GLUE_COMPRESSION_NONE: u8 = 0;
/// Glue: body compressed with zlib.
pub const GLUE_COMPRESSION_ZLIB: u8 = 5;
const GLUE_HEADER_LEN: usize = 18;

/// A framed value: the writer's schema and the body.
#[derive(Debug, PartialEq, Eq)]
pub struct Framed<'a> {
    /// The writer's schema.
    pub id: SchemaId,
    /// The body (still compressed when `zlib`).
    pub body: &'a [u8],
    /// Whether the body is zlib-compressed (Glue).
    pub zlib: bool,
}

/// Reads the registry header of a value.
pub fn frame(value: &[u8]) -> Result<Framed<'_>, Rejection> {
    match value.first() {
        Some(&CONFLUENT_MAGIC) if value.len() >= 5 => Ok(Framed {
            id: SchemaId::Confluent(u32::from_be_bytes([value[1], value[2], value[3], value[4]])),
            body: &value[5..],
            zlib: false,
        }),
        Some(&GLUE_HEADER_VERSION) if value.len() >= GLUE_HEADER_LEN => {
            let zlib = match value[1] {
                GLUE_COMPRESSION_NONE => false,
                GLUE_COMPRESSION_ZLIB => true,
                other => {
                    return Err(Rejection::new(
                        RejectKind::NoSchemaId,
                        format!(
                            "Glue Schema Registry header names compression {other}; only 0 (none) and 5 (zlib) exist"
                        ),
                    ));
                }
            };
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(&value[2..GLUE_HEADER_LEN]);
            Ok(Framed {
                id: SchemaId::Glue(uuid::Uuid::from_bytes(uuid)),
                body: &value[GLUE_HEADER_LEN..],
                zlib,
            })
        }
        first => Err(Rejection::new(
            RejectKind::NoSchemaId,
            format!(
                "value ({} bytes, first byte {}) has no schema registry header: expected the Confluent magic byte 0 and a 4-byte schema id, or the Glue header version 3; set format = \"json\" if the topic carries JSON",
                value.len(),
                first.map_or("none".to_string(), |b| b.to_string())
            ),
        )),
    }
}

/// A JSON topic's value that starts with a schema registry's header (JSON never starts with
/// byte 0 or 3): the rejection that says so and names the fix.
pub fn not_json_but_framed(value: &[u8]) -> Option<Rejection> {
    let framed = match value.first() {
        Some(&CONFLUENT_MAGIC) | Some(&GLUE_HEADER_VERSION) => frame(value).ok()?,
        _ => return None,
    };
    let header = match framed.id {
        SchemaId::Confluent(id) => format!("a Confluent schema registry header (schema id {id})"),
        SchemaId::Glue(id) => format!("a Glue Schema Registry header (schema version {id})"),
    };
    // JSON behind the header: a JSON Schema serializer's framing, which no format here reads.
    let json_body = !framed.zlib
        && framed
            .body
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| matches!(b, b'{' | b'['));
    let fix = if json_body {
        "its body is JSON, as a JSON Schema serializer frames it: that framing is not read (format = \"json\" takes plain JSON values; have the producer write plain JSON)"
    } else {
        "set format = \"avro\" (or \"protobuf\") for the topic's table, with its registry"
    };
    Some(Rejection::new(
        RejectKind::NotJson,
        format!(
            "value ({} bytes) is not JSON: it starts with {header}, so it looks registry-framed: {fix}",
            value.len()
        ),
    ))
}

/// Decompresses a zlib body into `out`, refusing more than `max_bytes`.
pub(super) fn inflate(body: &[u8], out: &mut Vec<u8>, max_bytes: usize) -> Result<(), Rejection> {
    out.clear();
    let limit = u64::try_from(max_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    flate2::read::ZlibDecoder::new(body)
        .take(limit)
        .read_to_end(out)
        .map_err(|e| {
            Rejection::new(
                RejectKind::SchemaMismatch,
                format!("zlib-compressed body (Glue compression 5) does not inflate: {e}"),
            )
        })?;
    if out.len() > max_bytes {
        return Err(Rejection::new(
            RejectKind::Oversize,
            format!("body inflates to more than {max_bytes} bytes (max_record_bytes)"),
        ));
    }
    Ok(())
}

/// The body of a framed value: as framed, or inflated into `scratch` when compressed.
pub(super) fn body<'a>(
    framed: &Framed<'a>,
    scratch: &'a mut Vec<u8>,
    max_bytes: usize,
) -> Result<&'a [u8], Rejection> {
    if framed.zlib {
        inflate(framed.body, scratch, max_bytes)?;
        Ok(scratch)
    } else {
        Ok(framed.body)
    }
}

/// The writer schemas a registry format's decoder was given, each compiled for its table (`T`) or
/// kept with why it cannot be used, and the ids the registry did not have at the last lookup
/// (asked again the next time a batch names them).
#[derive(Debug)]
pub(super) struct SchemaCache<T> {
    compiled: RwLock<HashMap<SchemaId, Result<Arc<T>, String>>>,
    missing: RwLock<HashMap<SchemaId, String>>,
}

impl<T> Default for SchemaCache<T> {
    fn default() -> Self {
        SchemaCache {
            compiled: RwLock::new(HashMap::new()),
            missing: RwLock::new(HashMap::new()),
        }
    }
}

impl<T> SchemaCache<T> {
    /// Whether `id` was given.
    pub fn knows(&self, id: &SchemaId) -> bool {
        self.compiled.read().is_ok_and(|c| c.contains_key(id))
    }

    /// Keeps `id`'s compiled schema (or why there is none). A schema of `kind` other than
    /// `want` (the topic's `format`) is refused with a reason naming both.
    pub fn insert(
        &self,
        id: SchemaId,
        kind: &str,
        want: (&str, &str),
        compile: impl FnOnce() -> Result<T, String>,
    ) {
        let (want_kind, format) = want;
        let compiled = if kind == want_kind {
            compile().map(Arc::new)
        } else {
            Err(format!(
                "{id} is a {kind} schema in the registry; the topic's format is {format}"
            ))
        };
        if let Ok(mut c) = self.compiled.write() {
            c.insert(id, compiled);
        }
    }

    /// Whether the registry lacked `id` at an earlier lookup.
    pub fn was_missing(&self, id: &SchemaId) -> bool {
        self.missing.read().is_ok_and(|m| m.contains_key(id))
    }

    /// Records that the registry does not have `id`, and why.
    pub fn add_missing(&self, id: SchemaId, reason: String) {
        if let Ok(mut m) = self.missing.write() {
            m.insert(id, reason);
        }
    }

    /// `id`'s compiled schema, or the `unknown_schema` rejection that says why there is none.
    pub fn get(&self, id: &SchemaId) -> Result<Arc<T>, Rejection> {
        let found = self.compiled.read().ok().and_then(|c| c.get(id).cloned());
        match found {
            Some(Ok(t)) => Ok(t),
            Some(Err(why)) => Err(Rejection::new(RejectKind::UnknownSchema, why)),
            None => {
                let reason = self.missing.read().ok().and_then(|m| m.get(id).cloned());
                Err(Rejection::new(
                    RejectKind::UnknownSchema,
                    reason.unwrap_or_else(|| format!("{id} is not in the schema registry")),
                ))
            }
        }
    }
}
