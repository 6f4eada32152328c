//! Iceberg's `FileIO` storage under the fault schedule: metadata, manifests and the data
//! readers read.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use serde::{Deserialize, Serialize};

use super::{Chaos, ChaosHandle, Strike};

/// Iceberg's file storage (metadata, manifests, data read by readers) under the schedule.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChaosStorage {
    #[serde(skip)]
    pub(super) inner: Option<Arc<dyn Storage>>,
    #[serde(skip)]
    pub(super) chaos: Option<Arc<ChaosHandle>>,
}

impl ChaosStorage {
    fn parts(&self) -> iceberg::Result<(&Arc<dyn Storage>, &Chaos)> {
        match (&self.inner, &self.chaos) {
            (Some(i), Some(c)) => Ok((i, c)),
            _ => Err(iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "chaos storage without parts",
            )),
        }
    }

    fn strike(&self, mutating: bool) -> iceberg::Result<Option<Strike>> {
        Ok(self.parts()?.1.roll(mutating))
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for ChaosStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        if let Some(s) = self.strike(false)? {
            return Err(Chaos::iceberg_error("exists", s));
        }
        self.parts()?.0.exists(path).await
    }
    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        if let Some(s) = self.strike(false)? {
            return Err(Chaos::iceberg_error("metadata", s));
        }
        self.parts()?.0.metadata(path).await
    }
    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        if let Some(s) = self.strike(false)? {
            return Err(Chaos::iceberg_error("read", s));
        }
        self.parts()?.0.read(path).await
    }
    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        if let Some(s) = self.strike(false)? {
            return Err(Chaos::iceberg_error("reader", s));
        }
        self.parts()?.0.reader(path).await
    }
    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        match self.strike(true)? {
            Some(Strike::Before) => Err(Chaos::iceberg_error("write", Strike::Before)),
            Some(Strike::After) => {
                self.parts()?.0.write(path, bs).await?;
                Err(Chaos::iceberg_error("write", Strike::After))
            }
            None => self.parts()?.0.write(path, bs).await,
        }
    }
    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        if let Some(s) = self.strike(false)? {
            return Err(Chaos::iceberg_error("writer", s));
        }
        self.parts()?.0.writer(path).await
    }
    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        match self.strike(true)? {
            Some(Strike::Before) => Err(Chaos::iceberg_error("delete", Strike::Before)),
            Some(Strike::After) => {
                self.parts()?.0.delete(path).await?;
                Err(Chaos::iceberg_error("delete", Strike::After))
            }
            None => self.parts()?.0.delete(path).await,
        }
    }
    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        if let Some(s) = self.strike(false)? {
            return Err(Chaos::iceberg_error("delete prefix", s));
        }
        self.parts()?.0.delete_prefix(path).await
    }
    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        if let Some(s) = self.strike(false)? {
            return Err(Chaos::iceberg_error("delete stream", s));
        }
        self.parts()?.0.delete_stream(paths).await
    }
    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }
    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// Builds [`ChaosStorage`] around the storage another factory builds.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ChaosStorageFactory {
    #[serde(skip)]
    pub(super) inner: Option<Arc<dyn StorageFactory>>,
    #[serde(skip)]
    pub(super) chaos: Option<Arc<ChaosHandle>>,
}

#[typetag::serde]
impl StorageFactory for ChaosStorageFactory {
    fn build(&self, config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        let inner = self
            .inner
            .as_ref()
            .ok_or_else(|| iceberg::Error::new(iceberg::ErrorKind::Unexpected, "no inner factory"))?
            .build(config)?;
        Ok(Arc::new(ChaosStorage {
            inner: Some(inner),
            chaos: self.chaos.clone(),
        }))
    }
}
