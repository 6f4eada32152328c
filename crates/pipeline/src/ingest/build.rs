//! Building an [`Ingestor`]: its tables' layouts, decoders and locations from the spec, the
//! backend's stores and clock, options and schema registries.

use std::collections::HashMap;
use std::sync::Arc;

use super::{IngestOptions, Ingestor, TopicTable, encode};
use crate::backend::Backend;
use crate::clock::Clock;
use crate::decode::Decoder;
use crate::error::Result;
use crate::process::Processor;
use crate::registry::Registries;
use crate::schema::TableLayout;
use crate::spec::{DEAD_LETTER_TABLE, PipelineSpec};
use crate::storage::Warehouse;
use crate::store::StateStore;

impl Ingestor {
    /// An ingestor for `spec` on `backend`.
    pub fn new(spec: &PipelineSpec, backend: &Backend) -> Result<Ingestor> {
        let ingestor = Self::with_parts(
            spec,
            backend.warehouse.clone(),
            backend.state.clone(),
            &backend.namespace,
        )?
        .with_clock(backend.clock.clone())
        .with_registries(Registries::configure(
            &spec.registry,
            |k| std::env::var(k).ok(),
            backend.glue_schemas.clone(),
        )?);
        #[cfg(feature = "sql")]
        let ingestor = {
            let mut ingestor = ingestor;
            ingestor.processor = ingestor.processor.with_reference_source(Arc::new(
                crate::references::CatalogReferences::new(
                    backend.catalog.clone(),
                    &backend.namespace,
                ),
            ));
            ingestor
        };
        Ok(ingestor)
    }

    /// The same ingestor with other options.
    pub fn with_options(mut self, options: IngestOptions) -> Ingestor {
        self.props = encode::micro_file_properties_at(options.zstd_level);
        self.options = options;
        self
    }

    /// The same ingestor with other schema registries.
    pub fn with_registries(mut self, registries: Registries) -> Ingestor {
        self.registries = registries;
        self
    }

    /// The same ingestor sharing `reloads` with the ingestors built before it.
    pub fn with_registry_reloads(mut self, reloads: super::RegistryReloads) -> Ingestor {
        self.registry_reloads = reloads;
        self
    }

    /// The ingestor's options.
    pub fn options(&self) -> &IngestOptions {
        &self.options
    }

    /// The same ingestor on another clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Ingestor {
        self.clock = clock;
        self
    }

    /// An ingestor on explicit parts (tests wrap the state store), without schema registries
    /// (see [`Ingestor::with_registries`]; [`Ingestor::new`] configures the spec's).
    pub fn with_parts(
        spec: &PipelineSpec,
        warehouse: Warehouse,
        state: Arc<dyn StateStore>,
        namespace: &str,
    ) -> Result<Ingestor> {
        let mut topics = HashMap::new();
        let mut layouts = HashMap::new();
        for t in &spec.tables {
            let layout = Arc::new(TableLayout::for_table(t)?);
            layouts.insert(t.name.clone(), layout.clone());
            topics.insert(
                t.topic.clone(),
                TopicTable {
                    spec: t.clone(),
                    layout,
                    decoder: Decoder::new(t),
                    key_decoder: super::tombstones::framed_keys(t)?,
                    location: warehouse.table_location(namespace, &t.name),
                },
            );
        }
        let processor = Processor::new(spec)?;
        let mut derived_locations = HashMap::new();
        for layout in processor.layouts() {
            layouts.insert(layout.name.clone(), layout.clone());
            derived_locations.insert(
                layout.name.clone(),
                warehouse.table_location(namespace, &layout.name),
            );
        }
        Ok(Ingestor {
            topics,
            processor,
            layouts,
            derived_locations,
            dead_letters: Arc::new(TableLayout::dead_letters()?),
            dead_letter_location: warehouse.table_location(namespace, DEAD_LETTER_TABLE),
            options: IngestOptions::for_spec(spec),
            warehouse,
            state,
            props: encode::micro_file_properties(),
            state_cache: Default::default(),
            run_cache: Default::default(),
            clock: crate::clock::system(),
            refused: HashMap::new(),
            registries: Registries::default(),
            registry_reloads: Default::default(),
        })
    }
}
