//! The commit stage's part of the ledger of delivered offsets ([`crate::ledger`]): each round's
//! part per topic-partition, given to the topic's own table, and folded into that table's
//! properties in the same metadata commit as the round's rows.

use std::collections::BTreeMap;

use iceberg::table::Table;

use super::select::{Selector, TableFiles};
use crate::checkpoint::{PendingBatch, SourcePartition};
use crate::error::Result;
use crate::ledger::{
    self, COUNTED_PROPERTY_PREFIX, Counted, Delivered, Fold, LEDGER_PROPERTY_PREFIX,
    STAMPS_PROPERTY_PREFIX, Stamps,
};
use crate::tables::TableSet;

/// One round's part of a topic-partition's ledger of delivered offsets ([`crate::ledger`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundLedger {
    /// The round's entries ([`ledger::round_entries`]).
    pub delivered: Vec<Delivered>,
    /// What replays landed in the round.
    pub replayed: Vec<Delivered>,
    /// Some batch of the round saw a gap between its own records.
    pub gaps_inside: bool,
    /// The round's time mark ([`ledger::Stamps`]): its first offset, and the latest Kafka
    /// timestamp the partition had taken when the round was committed (`None`: not known).
    pub stamp: Option<(i64, i64)>,
}

/// The round's part of the ledger of each topic-partition its batches took from. Idle
/// partitions' flushes deliver nothing.
pub fn round_ledger(batches: &[PendingBatch]) -> BTreeMap<SourcePartition, RoundLedger> {
    let mut out: BTreeMap<SourcePartition, RoundLedger> = BTreeMap::new();
    for b in batches {
        for r in b.ranges().filter(|r| r.first_offset >= 0) {
            let e = b.delivery.entry(&r);
            let part = out.entry(r.source.clone()).or_default();
            if b.delivery.replayed {
                part.replayed.push(e);
            } else {
                let records = i128::from(r.last_offset) - i128::from(r.first_offset) + 1;
                part.gaps_inside |= i128::from(e.count) < records;
                part.delivered.push(e);
            }
        }
    }
    for part in out.values_mut() {
        part.delivered = ledger::round_entries(std::mem::take(&mut part.delivered));
        part.replayed.sort_unstable();
    }
    out
}

/// The table properties of `table`'s ledgers with `parts` folded in. A ledger that cannot be
/// read is left as it is (and reported): `streamtable audit` names it until it is repaired.
pub(super) fn folded(
    table: &Table,
    name: &str,
    parts: &[(String, RoundLedger)],
) -> Vec<(String, String)> {
    parts
        .iter()
        .filter_map(|(source, part)| -> Option<(String, String)> {
            let key = format!("{LEDGER_PROPERTY_PREFIX}{source}");
            let mut fold = match table.metadata().properties().get(&key) {
                Some(v) => match Fold::decode(v) {
                    Ok(f) => f,
                    Err(why) => {
                        tracing::error!(table = name, property = %key, %why,
                            "the ledger of delivered offsets cannot be read; left as it is (remove the property to start it again)");
                        return None;
                    }
                },
                None => Fold::default(),
            };
            fold.add(&part.delivered, &part.replayed, part.gaps_inside);
            Some((key, fold.encode()))
        })
        .chain(parts.iter().filter_map(|(source, part)| {
            let (offset, ms) = part.stamp?;
            let key = format!("{STAMPS_PROPERTY_PREFIX}{source}");
            // Marks that cannot be read start again: a mark only ever makes a start earlier.
            let mut stamps = table
                .metadata()
                .properties()
                .get(&key)
                .and_then(|v| Stamps::decode(v).ok())
                .unwrap_or_default();
            stamps.add(offset, ms);
            Some((key, stamps.encode()))
        }))
        .collect()
}

/// Gives each topic's own table (an upsert table too) the round's part of its partitions'
/// ledgers (a round that landed none of the topic's rows there still commits it); a refused
/// table keeps its own batches pending, and must not hold up this round.
pub(super) async fn assign(
    tables: &TableSet,
    selector: &mut Selector<'_>,
    batches: &[PendingBatch],
    by_table: &mut BTreeMap<String, TableFiles>,
) -> Result<()> {
    let mut round = round_ledger(batches);
    // Each partition's time mark: the latest timestamp it had taken, from its checkpoint (at or
    // after every record of the round, which it took before).
    let sources: Vec<SourcePartition> = round
        .keys()
        .filter(|s| tables.topic_tables.contains_key(&s.topic))
        .cloned()
        .collect();
    if !sources.is_empty() {
        let checkpoints = selector.backend().state.checkpoints(&sources).await?;
        for (source, c) in sources.iter().zip(checkpoints) {
            let Some(part) = round.get_mut(source) else {
                continue;
            };
            let first = part
                .delivered
                .iter()
                .chain(&part.replayed)
                .map(|d| d.first)
                .min();
            // A timestamp not known (an earlier release's checkpoint) leaves no mark: the
            // audit then starts from what it finds, as before marks.
            part.stamp = first.filter(|_| c.newest_ms >= 0).map(|f| (f, c.newest_ms));
        }
    }
    for (source, part) in round {
        let Some(name) = tables.topic_tables.get(&source.topic) else {
            continue;
        };
        if let Err(why) = selector.table_status(name).await? {
            tracing::error!(table = %name, %source, reason = %why,
                "the round's part of the ledger of delivered offsets is not recorded: the table is refused");
            continue;
        }
        by_table
            .entry(name.clone())
            .or_default()
            .ledger
            .push((source.to_string(), part));
    }
    Ok(())
}

/// Table property of a topic-partition moved to a new log (`streamtable reset-partition`):
/// `streamtable.reset.{topic}-{partition}` = `{old checkpoint}@{old log's latest timestamp}`.
/// The old log's rows (below that checkpoint, stamped at or before that time) are not audited.
pub const RESET_PROPERTY_PREFIX: &str = "streamtable.reset.";

/// Sets the ledger of delivered offsets of `source` aside on `table` (a topic's own table):
/// renamed `streamtable.ledger-before.{source}.{now_ms}`, so that the partition's ledger starts
/// again with a new log (`streamtable reset-partition`); records where the old log ended
/// ([`RESET_PROPERTY_PREFIX`]: `old_checkpoint`, `old_newest_ms`). Returns whether the table
/// had a ledger for it.
pub async fn set_aside(
    backend: &crate::backend::Backend,
    ident: &iceberg::TableIdent,
    source: &SourcePartition,
    now_ms: i64,
    old_end: Option<(i64, i64)>,
) -> Result<bool> {
    use iceberg::transaction::{ApplyTransactionAction, Transaction};
    let Some((table, _)) = backend.catalog.load(ident).await? else {
        return Ok(false);
    };
    let key = format!("{LEDGER_PROPERTY_PREFIX}{source}");
    let fold = table.metadata().properties().get(&key).cloned();
    if fold.is_none() && old_end.is_none() {
        return Ok(false);
    }
    let tx = Transaction::new(&table);
    let mut update = tx.update_table_properties();
    if let Some((checkpoint, newest)) = old_end {
        update = update.set(
            format!("{RESET_PROPERTY_PREFIX}{source}"),
            format!("{checkpoint}@{newest}"),
        );
    }
    let had = fold.is_some();
    if let Some(fold) = fold {
        update = update
            .set(format!("streamtable.ledger-before.{source}.{now_ms}"), fold)
            .remove(key);
    }
    let tx = update.apply(tx).map_err(|e| {
        crate::error::Error::iceberg(format!("set the ledger of {source} aside"), e)
    })?;
    tx.commit(&backend.catalog).await.map_err(|e| {
        crate::error::Error::iceberg(format!("set the ledger of {source} aside"), e)
    })?;
    Ok(had)
}

/// The table properties of `table`'s counts ([`Counted`]) of `topic`'s partitions with `add`
/// applied to each partition of `per_partition` (records per Kafka partition). Counts that
/// cannot be read are left as they are (and reported): the audit names the partition.
pub fn counted(
    table: &Table,
    topic: &str,
    per_partition: &BTreeMap<i32, u64>,
    add: impl Fn(&mut Counted, u64),
) -> Vec<(String, String)> {
    per_partition
        .iter()
        .filter(|(_, n)| **n > 0)
        .filter_map(|(p, n)| {
            let key = format!("{COUNTED_PROPERTY_PREFIX}{topic}-{p}");
            let mut c = match table.metadata().properties().get(&key) {
                Some(v) => match Counted::decode(v) {
                    Ok(c) => c,
                    Err(why) => {
                        tracing::error!(table = %table.identifier(), property = %key, %why,
                            "an upsert table's counts cannot be read; left as they are");
                        return None;
                    }
                },
                None => Counted::default(),
            };
            add(&mut c, *n);
            Some((key, c.encode()))
        })
        .collect()
}
