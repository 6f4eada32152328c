//! The compressed body of a pending item: its file list and the ranges of its other
//! partitions, as zstd-compressed JSON.

use serde::{Deserialize, Serialize};

use crate::checkpoint::{PendingFile, SourceRange, decode_ranges, encode_ranges};
use crate::error::{Error, Result};

/// Largest body accepted when decompressing (a DynamoDB item holds 400 KB; a body that
/// inflates beyond this is corrupt, not a batch).
const MAX_BODY_BYTES: usize = 64 << 20;

#[derive(Serialize, Deserialize)]
struct Body {
    files: Vec<PendingFile>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    more: String,
}

/// The compressed body of `files` and `more`.
pub(super) fn encode(files: &[PendingFile], more: &[SourceRange]) -> Result<Vec<u8>> {
    let body = Body {
        files: files.to_vec(),
        more: if more.is_empty() {
            String::new()
        } else {
            encode_ranges(more)
        },
    };
    let json = serde_json::to_vec(&body)
        .map_err(|e| Error::Internal(format!("serialize pending batch: {e}")))?;
    zstd::bulk::compress(&json, 9)
        .map_err(|e| Error::Internal(format!("compress pending batch: {e}")))
}

/// The files and ranges of a compressed body, or why it cannot be read.
pub(super) fn decode(
    bytes: &[u8],
) -> std::result::Result<(Vec<PendingFile>, Vec<SourceRange>), String> {
    let json = zstd::bulk::decompress(bytes, MAX_BODY_BYTES)
        .map_err(|e| format!("pending item body does not decompress: {e}"))?;
    let body: Body =
        serde_json::from_slice(&json).map_err(|e| format!("pending item body is corrupt: {e}"))?;
    let more = if body.more.is_empty() {
        Vec::new()
    } else {
        decode_ranges(&body.more)?
    };
    Ok((body.files, more))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::SourcePartition;

    #[test]
    fn bodies_round_trip_and_garbage_is_refused() {
        let files = vec![PendingFile {
            table: "orders".into(),
            data_file: "{\"file_path\":\"s3://b/w/orders/data/x.parquet\"}".into(),
            rows: 10,
            bytes: 2048,
            partitioning: Some(vec!["day(created_at)".into()]),
        }];
        let more = vec![SourceRange {
            source: SourcePartition::new("orders", 3),
            first_offset: 1_000_000_000,
            last_offset: 1_000_000_099,
        }];
        let b = encode(&files, &more).expect("encode");
        assert_eq!(decode(&b).expect("decode"), (files.clone(), more));
        assert_eq!(
            decode(&encode(&files, &[]).expect("encode"))
                .expect("decode")
                .1,
            vec![]
        );
        assert!(decode(b"not zstd").is_err());
        let not_json = zstd::bulk::compress(b"[1,2", 3).expect("compress");
        assert!(decode(&not_json).unwrap_err().contains("corrupt"));
    }
}
