//! The batches an event source gave up on, as its on-failure destination keeps them (an Amazon
//! S3 destination writes one invocation record per batch; locally, a directory of such records
//! or of MSK event files): read for `streamtable audit --failed-batches`, which counts offsets
//! between landed batches as skipped only where such a record holds them.

use std::path::Path;

use super::GivenUp;
use crate::error::{Error, Result};

/// Most records read (a destination keeps them for `FailedBatchRetentionDays`).
const MAX_RECORDS: usize = 100_000;

/// Reads every failed batch under `location`: a directory (walked) or `s3://bucket[/prefix]`.
pub async fn read(location: &str) -> Result<GivenUp> {
    let mut out = GivenUp::default();
    match location.strip_prefix("s3://") {
        Some(rest) => read_s3(rest, location, &mut out).await?,
        None => read_dir(Path::new(location), &mut out)?,
    }
    Ok(out)
}

fn add(out: &mut GivenUp, bytes: &[u8], origin: &str) {
    match crate::replay::parse_failed_batch(bytes, origin).and_then(|e| out.add(&e)) {
        Ok(()) => {}
        Err(e) => out.unreadable.push(format!("{origin}: {e}")),
    }
}

fn read_dir(dir: &Path, out: &mut GivenUp) -> Result<()> {
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| Error::io("read failed batches", &d, e))?;
        for entry in entries {
            let path = entry
                .map_err(|e| Error::io("read failed batches", &d, e))?
                .path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            if out.batches + out.unreadable.len() >= MAX_RECORDS {
                return Err(Error::Config(format!(
                    "{}: more than {MAX_RECORDS} failed batches; replay them, then remove those replayed",
                    dir.display()
                )));
            }
            let bytes =
                std::fs::read(&path).map_err(|e| Error::io("read a failed batch", &path, e))?;
            add(out, &bytes, &path.display().to_string());
        }
    }
    Ok(())
}

#[cfg(feature = "aws")]
async fn read_s3(rest: &str, location: &str, out: &mut GivenUp) -> Result<()> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let sdk = crate::aws::load_config().await;
    let client = aws_sdk_s3::Client::new(&sdk);
    let fault = |op: &'static str, e: crate::aws::SdkFault| Error::ObjectStore {
        op,
        location: location.to_string(),
        message: e.message,
        retryable: e.retryable,
    };
    let mut token = None;
    loop {
        let page = client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .set_continuation_token(token.take())
            .send()
            .await
            .map_err(|e| fault("list failed batches", crate::aws::SdkFault::from_sdk(&e)))?;
        for object in page.contents() {
            let Some(key) = object.key() else { continue };
            if out.batches + out.unreadable.len() >= MAX_RECORDS {
                return Err(Error::Config(format!(
                    "{location}: more than {MAX_RECORDS} failed batches; replay them, then remove those replayed"
                )));
            }
            let got = client
                .get_object()
                .bucket(bucket)
                .key(key)
                .send()
                .await
                .map_err(|e| fault("read a failed batch", crate::aws::SdkFault::from_sdk(&e)))?;
            let bytes = got.body.collect().await.map_err(|e| Error::ObjectStore {
                op: "read a failed batch",
                location: format!("s3://{bucket}/{key}"),
                message: e.to_string(),
                retryable: true,
            })?;
            add(out, &bytes.into_bytes(), &format!("s3://{bucket}/{key}"));
        }
        match page.next_continuation_token() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    Ok(())
}

#[cfg(not(feature = "aws"))]
async fn read_s3(_: &str, location: &str, _: &mut GivenUp) -> Result<()> {
    Err(Error::Config(format!(
        "{location}: this build has no AWS support; copy the records to a directory"
    )))
}
