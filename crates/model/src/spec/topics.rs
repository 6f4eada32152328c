//! The deployment's event sources against the spec: the SAM template hands the functions the
//! table → topic mapping its event source mappings read (`STREAMTABLE_TOPICS`), and a spec that
//! disagrees is refused at start, naming the table, both topics and the fix — instead of
//! records arriving from a topic no table reads, or a table no event source fills.

use super::PipelineSpec;
use crate::error::{Error, Result};

/// The environment variable with the deployment's `table=topic,…` mapping.
pub const TOPICS_ENV: &str = "STREAMTABLE_TOPICS";

/// Parses `orders=orders,payments=prod.payments`.
pub fn parse_mapping(text: &str) -> Result<Vec<(String, String)>> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(t, k)| (t.trim().to_string(), k.trim().to_string()))
                .filter(|(t, k)| !t.is_empty() && !k.is_empty())
                .ok_or_else(|| {
                    Error::Config(format!(
                        "{TOPICS_ENV}: {pair:?} is not table=topic; write e.g. orders=orders,payments=payments"
                    ))
                })
        })
        .collect()
}

impl PipelineSpec {
    /// Refuses a spec whose topics' tables are not those the deployment's event sources
    /// deliver (`mapping`: table → topic, from the template).
    pub fn check_deployed_topics(&self, mapping: &[(String, String)]) -> Result<()> {
        let mut problems = Vec::new();
        for (table, topic) in mapping {
            match self.table(table) {
                Some(t) if &t.topic == topic => {}
                Some(t) => problems.push(format!(
                    "table {table}: the event source mapping reads topic {topic:?}, the spec says topic = {:?}",
                    t.topic
                )),
                None => problems.push(format!(
                    "topic {topic:?}: the event source mapping delivers it for table {table}, which the spec does not have"
                )),
            }
        }
        for t in &self.tables {
            if !mapping.iter().any(|(table, _)| table == &t.name) {
                problems.push(format!(
                    "table {}: no event source mapping reads its topic {:?}",
                    t.name, t.topic
                ));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(Error::Config(format!(
            "{}: the deployment and the pipeline spec disagree: {}; make the template's topic parameters (and its event source mappings) and the spec's [[tables]] topic agree, then deploy again",
            self.origin.display(),
            problems.join("; ")
        )))
    }
}
