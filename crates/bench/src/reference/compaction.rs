//! The compaction comparison: 1 GB of small files, streamtable (copy and re-encode) and pyarrow.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::{ReferenceArgs, Row, json_of, num};
use crate::compact;
use crate::config::Config;
use crate::error::{Error, Result};

pub(super) async fn compaction(
    config: &Config,
    args: &ReferenceArgs,
    dir: &Path,
    rows: &mut Vec<Row>,
) -> Result<()> {
    const TARGET_MB: u64 = 128;
    println!(
        "== compaction: {} MB of 1-5 MB files into {TARGET_MB} MB files",
        args.compact_mb
    );
    let mut ours = Vec::new();
    let mut python = None;
    for reencode in [false, true] {
        let home = dir.join(if reencode {
            "compact-reencode"
        } else {
            "compact-copy"
        });
        let line = compact::prepare(config, &home, args.compact_mb, TARGET_MB).await?;
        if !reencode {
            println!("{line}");
            // pyarrow reads the same table's files before streamtable compacts them.
            python = Some(json_of(
                Command::new(&args.python)
                    .arg(args.reference_dir.join("compact.py"))
                    .arg("--home")
                    .arg(&home)
                    .args(["--target-mb", &TARGET_MB.to_string(), "--out"])
                    .arg(dir.join("compact-python")),
                "bench/reference/compact.py",
            )?);
            let _ = std::fs::remove_dir_all(dir.join("compact-python"));
        }
        let out = compact::compact_in_fresh_process(&home, TARGET_MB, reencode, true)?;
        let out: Value = serde_json::from_str(out.trim()).map_err(|e| {
            Error::Internal(format!(
                "streamtable-bench compact-once printed {out:?}: {e}"
            ))
        })?;
        let _ = std::fs::remove_dir_all(&home);
        ours.push(out);
    }
    let python = python.ok_or_else(|| Error::Internal("no pyarrow compaction result".into()))?;
    let rate = |v: &Value, t: &str| -> Result<f64> { Ok(num(v, "input_mb")? / num(v, t)?) };
    let py_cpu = rate(&python, "cpu_s")?;
    let py_wall = rate(&python, "wall_s")?;
    for (out, what) in ours
        .iter()
        .zip(["large row groups copied", "every row group re-encoded"])
    {
        let (cpu, wall, rss) = (
            rate(out, "cpu_s")?,
            rate(out, "wall_s")?,
            num(out, "rss_mb")?,
        );
        println!(
            "streamtable ({what}): {cpu:.0} MB/s per CPU-second, {wall:.0} MB/s wall, {} files, RSS {rss:.0} MB",
            num(out, "output_files")?
        );
        rows.push(
            Row::new(
                &format!("(c) compaction, {what}: MB/CPU-s"),
                format!("{cpu:.0}"),
            )
            .refs(
                String::new(),
                format!("{py_cpu:.0}"),
                format!("{:.1}x pyarrow", cpu / py_cpu),
            )
            .target(">= 150", cpu >= 150.0),
        );
        rows.push(
            Row::new("    wall MB/s; peak RSS MB", format!("{wall:.0}; {rss:.0}"))
                .refs(
                    String::new(),
                    format!("{py_wall:.0}; {:.0}", num(&python, "rss_mb")?),
                    format!("{:.1}x", wall / py_wall),
                )
                .target("RSS <= 512", rss <= 512.0),
        );
    }
    println!(
        "pyarrow read-and-rewrite: {py_cpu:.0} MB/s per CPU-second, {py_wall:.0} MB/s wall, {} files, RSS {:.0} MB",
        num(&python, "output_files")?,
        num(&python, "rss_mb")?
    );
    Ok(())
}
