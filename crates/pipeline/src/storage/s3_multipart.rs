//! Writing an S3 object as iceberg's `FileWrite`: buffered, one `PutObject` when it stays under
//! one part, a multipart upload of 64 MiB parts when it grows (compaction output past 64 MiB),
//! aborted on any failure, so memory stays bounded by one part.

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::{Bytes, BytesMut};
use iceberg::io::FileWrite;

use super::s3::{fault, put, split_location};
use crate::aws::SdkFault;

/// Part size of multipart uploads (S3's minimum is 5 MiB). Large, because every request is
/// billed: a compacted file under 64 MiB is one `PutObject` instead of a create, its parts and
/// a complete; the scheduled Lambda writes one file at a time, so this is its one buffer.
pub(super) const PART_SIZE: usize = 64 * 1024 * 1024;

pub(super) struct S3Write {
    client: Client,
    location: String,
    buffer: BytesMut,
    /// Upload id and the parts uploaded so far, once the object outgrew one part.
    upload: Option<(String, Vec<CompletedPart>)>,
}

impl S3Write {
    /// A writer of the object at `location` (nothing is sent before the first full part).
    pub(super) fn new(client: Client, location: String) -> Self {
        S3Write {
            client,
            location,
            buffer: BytesMut::new(),
            upload: None,
        }
    }

    async fn flush_part(&mut self) -> iceberg::Result<()> {
        let (bucket, key) = split_location(&self.location)?;
        if self.upload.is_none() {
            let created = self
                .client
                .create_multipart_upload()
                .bucket(bucket)
                .key(key)
                .send()
                .await
                .map_err(|e| {
                    fault(
                        "create multipart upload",
                        &self.location,
                        SdkFault::from_sdk(&e),
                    )
                })?;
            let id = created.upload_id().unwrap_or_default().to_string();
            self.upload = Some((id, Vec::new()));
        }
        let Some((id, parts)) = self.upload.as_mut() else {
            return Ok(());
        };
        let number = parts.len() as i32 + 1;
        let body = self.buffer.split().freeze();
        let out = self
            .client
            .upload_part()
            .bucket(bucket)
            .key(key)
            .upload_id(id.as_str())
            .part_number(number)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| fault("upload part", &self.location, SdkFault::from_sdk(&e)))?;
        parts.push(
            CompletedPart::builder()
                .part_number(number)
                .set_e_tag(out.e_tag().map(str::to_string))
                .build(),
        );
        Ok(())
    }

    async fn abort(&self) {
        if let (Some((id, _)), Ok((bucket, key))) = (&self.upload, split_location(&self.location)) {
            let _ = self
                .client
                .abort_multipart_upload()
                .bucket(bucket)
                .key(key)
                .upload_id(id)
                .send()
                .await;
        }
    }
}

#[async_trait]
impl FileWrite for S3Write {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        self.buffer.extend_from_slice(&bs);
        if self.buffer.len() >= PART_SIZE
            && let Err(e) = self.flush_part().await
        {
            self.abort().await;
            return Err(e);
        }
        Ok(())
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        if self.upload.is_none() {
            let body = self.buffer.split().freeze();
            return put(&self.client, &self.location, body).await;
        }
        let result = async {
            if !self.buffer.is_empty() {
                self.flush_part().await?;
            }
            let (bucket, key) = split_location(&self.location)?;
            let Some((id, parts)) = self.upload.clone() else {
                return Ok(());
            };
            self.client
                .complete_multipart_upload()
                .bucket(bucket)
                .key(key)
                .upload_id(&id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(parts))
                        .build(),
                )
                .send()
                .await
                .map_err(|e| {
                    fault(
                        "complete multipart upload",
                        &self.location,
                        SdkFault::from_sdk(&e),
                    )
                })?;
            self.upload = None;
            Ok(())
        }
        .await;
        if result.is_err() {
            self.abort().await;
        }
        result
    }
}
