//! Amazon S3 behind Iceberg's `Storage` trait, on the AWS SDK.
//!
//! One S3 stack for the whole project: the SDK's credentials chain (Lambda role, environment,
//! profile), its retries, and `AWS_ENDPOINT_URL` for a local emulator. Small objects are written
//! with one `PutObject`; large ones (compaction output) stream as a multipart upload so memory
//! stays bounded by one part.

use std::ops::Range;
use std::sync::Arc;

use crate::storage::object_error;
use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use serde::{Deserialize, Serialize};

use super::s3_multipart::S3Write;
use crate::aws::SdkFault;

/// Splits `s3://bucket/key` (or `s3a://`) into bucket and key.
pub fn split_location(location: &str) -> iceberg::Result<(&str, &str)> {
    let rest = location
        .strip_prefix("s3://")
        .or_else(|| location.strip_prefix("s3a://"))
        .ok_or_else(|| invalid(location, "is not an s3:// location"))?;
    let (bucket, key) = rest
        .split_once('/')
        .ok_or_else(|| invalid(location, "has no object key after the bucket"))?;
    if bucket.is_empty() {
        return Err(invalid(location, "has no bucket"));
    }
    Ok((bucket, key))
}

fn invalid(location: &str, why: &str) -> iceberg::Error {
    iceberg::Error::new(iceberg::ErrorKind::DataInvalid, format!("{location} {why}"))
}

pub(super) fn fault(op: &'static str, location: &str, f: SdkFault) -> iceberg::Error {
    let kind = if f.is_not_found() {
        iceberg::ErrorKind::DataInvalid
    } else {
        iceberg::ErrorKind::Unexpected
    };
    iceberg::Error::new(kind, format!("S3 {op} {location}: {}", f.message))
        .with_retryable(f.retryable)
}

/// S3 storage for Iceberg's `FileIO`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct S3Storage {
    #[serde(skip)]
    client: Option<Client>,
}

impl S3Storage {
    /// Storage on an SDK client built once by the caller.
    pub fn new(client: Client) -> Self {
        S3Storage {
            client: Some(client),
        }
    }

    fn client(&self) -> iceberg::Result<&Client> {
        self.client.as_ref().ok_or_else(|| {
            iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "S3 storage used without an SDK client",
            )
        })
    }

    /// Lists the objects under `prefix` (an `s3://bucket/prefix` location): location, size and
    /// last-modified time in epoch milliseconds.
    pub async fn list(&self, prefix: &str) -> iceberg::Result<Vec<(String, u64, i64)>> {
        let (bucket, key_prefix) = split_location(prefix)?;
        let client = self.client()?;
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = client
                .list_objects_v2()
                .bucket(bucket)
                .prefix(key_prefix)
                .set_continuation_token(token)
                .send()
                .await
                .map_err(|e| fault("list", prefix, SdkFault::from_sdk(&e)))?;
            for o in page.contents() {
                if let Some(key) = o.key() {
                    let modified = o
                        .last_modified()
                        .map_or(0, |t| t.secs() * 1000 + t.subsec_nanos() as i64 / 1_000_000);
                    out.push((
                        format!("s3://{bucket}/{key}"),
                        o.size().unwrap_or(0) as u64,
                        modified,
                    ));
                }
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated() == Some(true) => token = Some(t.to_string()),
                _ => break,
            }
        }
        Ok(out)
    }

    /// Size and last-modified time (epoch milliseconds) of an object; `None` if it is absent.
    pub async fn head(&self, location: &str) -> iceberg::Result<Option<(u64, i64)>> {
        let (bucket, key) = split_location(location)?;
        match self
            .client()?
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
        {
            Ok(h) => {
                let modified = h
                    .last_modified()
                    .map_or(0, |t| t.secs() * 1000 + t.subsec_nanos() as i64 / 1_000_000);
                Ok(Some((
                    h.content_length().unwrap_or(0).max(0) as u64,
                    modified,
                )))
            }
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if f.is_not_found() {
                    Ok(None)
                } else {
                    Err(fault("head", location, f))
                }
            }
        }
    }

    async fn delete_keys(&self, bucket: &str, keys: Vec<String>) -> iceberg::Result<()> {
        let client = self.client()?;
        for chunk in keys.chunks(1000) {
            let objects = chunk
                .iter()
                .map(|k| ObjectIdentifier::builder().key(k).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(bucket, &e.to_string()))?;
            let delete = Delete::builder()
                .set_objects(Some(objects))
                .quiet(true)
                .build()
                .map_err(|e| invalid(bucket, &e.to_string()))?;
            let out = client
                .delete_objects()
                .bucket(bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| fault("delete", bucket, SdkFault::from_sdk(&e)))?;
            if let Some(e) = out.errors().first() {
                return Err(iceberg::Error::new(
                    iceberg::ErrorKind::Unexpected,
                    format!(
                        "S3 delete s3://{bucket}/{}: {}",
                        e.key().unwrap_or_default(),
                        e.message().unwrap_or_default()
                    ),
                )
                .with_retryable(true));
            }
        }
        Ok(())
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for S3Storage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        let (bucket, key) = split_location(path)?;
        match self
            .client()?
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => {
                let f = SdkFault::from_sdk(&e);
                if f.is_not_found() {
                    Ok(false)
                } else {
                    Err(fault("head", path, f))
                }
            }
        }
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        let (bucket, key) = split_location(path)?;
        let head = self
            .client()?
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| fault("head", path, SdkFault::from_sdk(&e)))?;
        Ok(FileMetadata {
            size: head.content_length().unwrap_or(0).max(0) as u64,
        })
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        get(self.client()?, path, None).await
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        split_location(path)?;
        Ok(Box::new(S3Read {
            client: self.client()?.clone(),
            location: path.to_string(),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        put(self.client()?, path, bs).await
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        split_location(path)?;
        Ok(Box::new(S3Write::new(
            self.client()?.clone(),
            path.to_string(),
        )))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        let (bucket, key) = split_location(path)?;
        self.client()?
            .delete_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| fault("delete", path, SdkFault::from_sdk(&e)))?;
        Ok(())
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        let prefix = if path.ends_with('/') {
            path.to_string()
        } else {
            format!("{path}/")
        };
        let (bucket, _) = split_location(&prefix)?;
        let keys = self
            .list(&prefix)
            .await?
            .into_iter()
            .filter_map(|(loc, _, _)| split_location(&loc).ok().map(|(_, k)| k.to_string()))
            .collect();
        self.delete_keys(bucket, keys).await
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        let mut by_bucket: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        while let Some(p) = paths.next().await {
            let (bucket, key) = split_location(&p)?;
            by_bucket
                .entry(bucket.to_string())
                .or_default()
                .push(key.to_string());
        }
        for (bucket, keys) in by_bucket {
            self.delete_keys(&bucket, keys).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

async fn get(client: &Client, location: &str, range: Option<Range<u64>>) -> iceberg::Result<Bytes> {
    let (bucket, key) = split_location(location)?;
    let mut req = client.get_object().bucket(bucket).key(key);
    if let Some(r) = &range {
        if r.start >= r.end {
            return Ok(Bytes::new());
        }
        req = req.range(format!("bytes={}-{}", r.start, r.end - 1));
    }
    let out = req
        .send()
        .await
        .map_err(|e| fault("get", location, SdkFault::from_sdk(&e)))?;
    let body = out.body.collect().await.map_err(|e| {
        iceberg::Error::new(
            iceberg::ErrorKind::Unexpected,
            format!("S3 get {location}: {e}"),
        )
        .with_retryable(true)
    })?;
    Ok(body.into_bytes())
}

pub(super) async fn put(client: &Client, location: &str, bytes: Bytes) -> iceberg::Result<()> {
    let (bucket, key) = split_location(location)?;
    client
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(ByteStream::from(bytes))
        .send()
        .await
        .map_err(|e| fault("put", location, SdkFault::from_sdk(&e)))?;
    Ok(())
}

struct S3Read {
    client: Client,
    location: String,
}

#[async_trait]
impl FileRead for S3Read {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        get(&self.client, &self.location, Some(range)).await
    }
}

/// Builds [`S3Storage`] for a `FileIO`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct S3StorageFactory {
    #[serde(skip)]
    client: Option<Client>,
}

impl S3StorageFactory {
    /// A factory handing out storage on `client`.
    pub fn new(client: Client) -> Self {
        S3StorageFactory {
            client: Some(client),
        }
    }
}

#[typetag::serde]
impl StorageFactory for S3StorageFactory {
    fn build(&self, _config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        match &self.client {
            Some(c) => Ok(Arc::new(S3Storage::new(c.clone()))),
            None => Err(iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "S3 storage factory has no SDK client",
            )),
        }
    }
}

#[async_trait]
impl crate::storage::ObjectStore for S3Storage {
    async fn write(&self, location: &str, bytes: Bytes) -> crate::Result<()> {
        let out =
            Storage::new_output(self, location).map_err(|e| object_error("write", location, e))?;
        out.write(bytes)
            .await
            .map_err(|e| object_error("write", location, e))
    }

    async fn read(&self, location: &str) -> crate::Result<Bytes> {
        Storage::read(self, location)
            .await
            .map_err(|e| object_error("read", location, e))
    }

    async fn delete(&self, location: &str) -> crate::Result<()> {
        Storage::delete(self, location)
            .await
            .map_err(|e| object_error("delete", location, e))
    }

    async fn list(&self, prefix: &str) -> crate::Result<Vec<crate::storage::ObjectInfo>> {
        Ok(S3Storage::list(self, prefix)
            .await
            .map_err(|e| object_error("list", prefix, e))?
            .into_iter()
            .map(|(location, size, modified_ms)| crate::storage::ObjectInfo {
                location,
                size,
                modified_ms,
            })
            .collect())
    }

    async fn stat(&self, location: &str) -> crate::Result<Option<crate::storage::ObjectInfo>> {
        Ok(self
            .head(location)
            .await
            .map_err(|e| object_error("stat", location, e))?
            .map(|(size, modified_ms)| crate::storage::ObjectInfo {
                location: location.to_string(),
                size,
                modified_ms,
            }))
    }
}
