//! An interval join's kept rows as runs: immutable Parquet objects per side, oldest first,
//! named in the join table's snapshot summary. A round writes only its new rows that can still
//! match as a run; a run none of whose rows can match is dropped whole, unread; young runs are
//! merged into segments so that a kept row is written about twice.

use arrow_array::RecordBatch;
use datafusion::arrow::compute::{concat_batches, filter_record_batch};
use serde::{Deserialize, Serialize};

use super::rows::{arrow, parquet_bytes};
use crate::backend::Backend;
use crate::error::{Error, Result};

/// A run of a side's kept rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct KeptRun {
    /// The Parquet object.
    pub(super) location: String,
    /// Its rows.
    pub(super) rows: u64,
    /// A segment (young runs merged, never merged again) or one round's new rows.
    #[serde(default)]
    pub(super) merged: bool,
}

/// Young runs of a side merged into a segment once there are this many: every kept row is
/// written about twice (more when rows stay matchable past ~120 rounds: the merge past [`MAX_RUNS`] rewrites them).
const MAX_YOUNG_RUNS: usize = 4;

/// Runs of a side past this count are merged into one (rows a stray late time keeps alive).
const MAX_RUNS: usize = 32;

/// A side's runs after a round: the runs with a row that can still match, and the round's new
/// rows that can as a run of their own — merged with the young runs into a segment once they
/// number [`MAX_YOUNG_RUNS`], everything into one past [`MAX_RUNS`] or when the bound forgot
/// rows (`evicted`: the rows kept). `counts`: the rows of each of `runs`, which are the first
/// rows of `all`; `mask`: which of `all` can still match. Returns the runs and the bytes written.
pub(super) async fn next_runs(
    backend: &Backend,
    prefix: &str,
    runs: &[KeptRun],
    counts: &[usize],
    all: &RecordBatch,
    mask: &arrow_array::BooleanArray,
    evicted: Option<&RecordBatch>,
) -> Result<(Vec<KeptRun>, u64, u64)> {
    let (mut written, mut rows_written) = (0u64, 0u64);
    let write = |rows: RecordBatch, merged: bool| {
        let bytes = parquet_bytes(&rows);
        async move {
            let bytes = bytes?;
            let hash = xxhash_rust::xxh3::xxh3_64(&bytes);
            let kind = if merged { "segment" } else { "run" };
            let location = format!("{prefix}-{kind}-{hash:016x}.parquet");
            let n = bytes.len() as u64;
            backend.warehouse.write(&location, bytes).await?;
            Ok::<_, Error>((
                KeptRun {
                    location,
                    rows: rows.num_rows() as u64,
                    merged,
                },
                n,
            ))
        }
    };
    let range = |from: usize, len: usize| -> Result<RecordBatch> {
        filter_record_batch(&all.slice(from, len), &mask.slice(from, len)).map_err(arrow)
    };
    let kept_len: usize = counts.iter().sum();
    let fresh = range(kept_len, all.num_rows() - kept_len)?;
    if let Some(kept) = evicted {
        return Ok(if kept.num_rows() == 0 {
            (Vec::new(), 0, 0)
        } else {
            let (run, n) = write(kept.clone(), true).await?;
            (vec![run], n, kept.num_rows() as u64)
        });
    }
    // Runs with a row that can still match, with where their rows are.
    let mut live: Vec<(KeptRun, usize, usize)> = Vec::new();
    let mut at = 0;
    for (r, &n) in runs.iter().zip(counts) {
        if mask.slice(at, n).true_count() > 0 {
            let mut r = r.clone();
            r.rows = n as u64;
            live.push((r, at, n));
        }
        at += n;
    }
    if live.len() + 1 > MAX_RUNS {
        let all_kept = filter_record_batch(all, mask).map_err(arrow)?;
        if all_kept.num_rows() == 0 {
            return Ok((Vec::new(), 0, 0));
        }
        let rows = all_kept.num_rows() as u64;
        let (run, n) = write(all_kept, true).await?;
        return Ok((vec![run], n, rows));
    }
    let young = live.iter().rev().take_while(|(r, _, _)| !r.merged).count();
    if young + 1 >= MAX_YOUNG_RUNS {
        let split = live.len() - young;
        let mut parts = Vec::with_capacity(young + 1);
        for (_, from, n) in &live[split..] {
            parts.push(range(*from, *n)?);
        }
        parts.push(fresh);
        let rows = concat_batches(&all.schema(), &parts).map_err(arrow)?;
        live.truncate(split);
        let mut out: Vec<KeptRun> = live.into_iter().map(|(r, _, _)| r).collect();
        if rows.num_rows() > 0 {
            rows_written += rows.num_rows() as u64;
            let (run, n) = write(rows, true).await?;
            written += n;
            out.push(run);
        }
        return Ok((out, written, rows_written));
    }
    let mut out: Vec<KeptRun> = live.into_iter().map(|(r, _, _)| r).collect();
    if fresh.num_rows() > 0 {
        rows_written += fresh.num_rows() as u64;
        let (run, n) = write(fresh, false).await?;
        written += n;
        out.push(run);
    }
    Ok((out, written, rows_written))
}

/// Kept rows are read (and, once done, deleted) only from the join's own state objects under
/// `root`: a damaged or forged summary naming anything else fails the round, never followed.
pub(super) fn own_objects<'a>(
    root: &str,
    name: &str,
    runs: impl Iterator<Item = &'a KeptRun>,
) -> Result<()> {
    let own = format!("{}/_state/join/{name}/", root.trim_end_matches('/'));
    for r in runs {
        let rest = r.location.strip_prefix(&own).unwrap_or_default();
        if !rest.ends_with(".parquet") || rest.contains('/') {
            return Err(Error::Internal(format!(
                "interval join {name}: its state names kept rows in {}, outside its state objects ({own})",
                r.location
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_rows_are_read_only_from_the_joins_own_objects() {
        let run = |l: &str| KeptRun {
            location: l.into(),
            rows: 1,
            merged: false,
        };
        let ok = [run("/w/_state/join/j/i-left-run-00.parquet")];
        assert!(own_objects("/w/", "j", ok.iter()).is_ok());
        for bad in [
            "/w/db.db/orders/data/a.parquet",
            "/w/_state/join/other/i-left-run-00.parquet",
            "/w/_state/join/j/../../db.db/orders/data/a.parquet",
            "/w/_state/join/j/backlog.json",
        ] {
            let e = own_objects("/w", "j", [run(bad)].iter()).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}
