//! An ingestor that follows the schema registry: when a table whose columns come from the
//! registry meets a writer schema with new fields, the spec is read again (the subject's latest
//! version, merged with the catalog), the table evolves to it, and the batch lands with the new
//! columns. What the ingest function and `streamtable ingest` serve batches with.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::{IngestOptions, IngestSummary, Ingestor, RegistryReloads};
use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::esm::EsmEvent;
use crate::spec::PipelineSpec;

/// Reads the pipeline spec (with its registry tables' columns resolved).
pub type SpecLoader =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<PipelineSpec>> + Send>> + Send + Sync>;

/// The ingest options for a spec.
type OptionsFor = Arc<dyn Fn(&PipelineSpec) -> Result<IngestOptions> + Send + Sync>;

/// How many times one batch may make the spec be read again.
const MAX_RELOADS: usize = 2;

/// An [`Ingestor`] built on first use (so that an unreachable catalog or registry fails an
/// invocation, which is retried, not the process), and built again when a registry table's
/// writer schema gains fields.
pub struct LiveIngestor {
    load: SpecLoader,
    backend: Backend,
    options: OptionsFor,
    current: tokio::sync::Mutex<Option<Arc<Ingestor>>>,
    reloads: RegistryReloads,
}

impl LiveIngestor {
    /// An ingestor of the spec `config` names, read through the registry and `backend`'s
    /// catalog ([`Config::load_pipeline_resolved`]), with the environment's options: what the
    /// ingest function and `streamtable ingest` serve batches with.
    pub fn from_config(config: &Config, backend: Backend) -> LiveIngestor {
        let load: SpecLoader = {
            let (config, backend) = (config.clone(), backend.clone());
            Arc::new(move || {
                let (config, backend) = (config.clone(), backend.clone());
                Box::pin(async move { config.load_pipeline_resolved(&backend).await })
            })
        };
        LiveIngestor::new(load, backend, IngestOptions::from_env)
    }

    /// An ingestor of the spec `load` reads, on `backend`, with the options `options` gives
    /// for it.
    pub fn new(
        load: SpecLoader,
        backend: Backend,
        options: impl Fn(&PipelineSpec) -> Result<IngestOptions> + Send + Sync + 'static,
    ) -> LiveIngestor {
        LiveIngestor {
            load,
            backend,
            options: Arc::new(options),
            current: tokio::sync::Mutex::new(None),
            reloads: RegistryReloads::default(),
        }
    }

    /// The current ingestor, built (spec read, tables resolved against the catalog) if there is
    /// none.
    pub async fn ingestor(&self) -> Result<Arc<Ingestor>> {
        let mut current = self.current.lock().await;
        if let Some(i) = current.as_ref() {
            return Ok(i.clone());
        }
        let spec = (self.load)().await?;
        let ingestor = Ingestor::connect(&spec, &self.backend)
            .await?
            .with_options((self.options)(&spec)?)
            .with_registry_reloads(self.reloads.clone());
        let ingestor = Arc::new(ingestor);
        *current = Some(ingestor.clone());
        Ok(ingestor)
    }

    /// Lands one batch ([`Ingestor::handle`]); when a registry table's columns grew, reads the
    /// spec again and lands the rest of the batch with the new columns.
    pub async fn handle(&self, event: &EsmEvent) -> Result<IngestSummary> {
        let mut reloads = 0;
        loop {
            let ingestor = self.ingestor().await?;
            match ingestor.handle(event).await {
                Err(e @ Error::RegistryColumnsGrew { .. }) if reloads < MAX_RELOADS => {
                    reloads += 1;
                    tracing::info!(reason = %e, "reading the spec from the registry again");
                    let mut current = self.current.lock().await;
                    if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &ingestor)) {
                        *current = None;
                    }
                }
                other => {
                    // A refused table (a schema change the catalog cannot take, or a catalog
                    // call it was not allowed to make) is resolved again by the next
                    // invocation: a fixed spec, table or permission lands the topic without
                    // waiting for the container to be recycled.
                    if other.is_err() && ingestor.has_refused() {
                        let mut current = self.current.lock().await;
                        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &ingestor)) {
                            *current = None;
                        }
                    }
                    return other;
                }
            }
        }
    }
}
