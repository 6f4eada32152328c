//! Where checkpoints live in the state table: the key of a partition's bucket item (and of the
//! per-partition item of releases before 0.3), and how consecutive partitions are grouped into
//! transactions of at most 100 items.

use crate::checkpoint::SourcePartition;

/// Partitions per checkpoint bucket: 96 entries of offsets below 10¹⁰ keep an item under 1 KB
/// (one write unit, two in a transaction).
pub const BUCKET_PARTITIONS: i32 = 96;
/// The key of the bucket holding `source`'s checkpoint.
pub(super) fn bucket_key(source: &SourcePartition) -> String {
    format!(
        "checkpoints#{}#{:06}",
        source.topic,
        source.partition.div_euclid(BUCKET_PARTITIONS)
    )
}

/// The per-partition item of releases before 0.3.
pub(super) fn legacy_key(source: &SourcePartition) -> String {
    format!("source#{}#{}", source.topic, source.partition)
}

/// Stateful partitions one transaction takes: a state entry holds at most 64 bytes inline
/// (otherwise the name of its state file), the pending batch up to 300 KB, and a DynamoDB
/// transaction at most 4 MB, so 64 states and the pending batch always fit, whatever their
/// sizes (items of the layout before, up to 300 KB, are only read).
pub const MAX_STATES_PER_TRANSACTION: usize = 64;

/// Splits consecutive `sources` into groups of at most 100 transaction items each: the
/// checkpoint and state buckets a group touches, `per_partition` more items per partition
/// (mirror mode), one more per stateful partition (its item of the state layout before, which
/// its first write in the bucket replaces; at most [`MAX_STATES_PER_TRANSACTION`]: bytes, not
/// items, bound those), and the pending batch.
pub(super) fn split(
    sources: &[SourcePartition],
    per_partition: usize,
    stateful: &[bool],
) -> Vec<usize> {
    let mut sizes = Vec::new();
    let (mut len, mut items, mut states) = (0usize, 1usize, 0usize);
    let mut seen: Vec<String> = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        let state = usize::from(stateful.get(i).copied().unwrap_or(false));
        let mut keys = vec![bucket_key(s)];
        if state == 1 {
            keys.push(super::partition_state::bucket_pk(s));
        }
        let new_buckets = keys.iter().filter(|k| !seen.contains(k)).count();
        // A stateful partition may also replace its item of the layout before.
        let per_partition = per_partition + state;
        if len > 0
            && (items + new_buckets + per_partition > super::MAX_TRANSACTION_ITEMS
                || states + state > MAX_STATES_PER_TRANSACTION)
        {
            sizes.push(len);
            (len, items, states) = (0, 1, 0);
            seen.clear();
        }
        for key in keys {
            if !seen.contains(&key) {
                seen.push(key);
                items += 1;
            }
        }
        items += per_partition;
        states += state;
        len += 1;
    }
    if len > 0 {
        sizes.push(len);
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_share_a_bucket_by_range() {
        let b = |p| bucket_key(&SourcePartition::new("orders", p));
        assert_eq!(b(0), "checkpoints#orders#000000");
        assert_eq!(b(95), b(0));
        assert_eq!(b(96), "checkpoints#orders#000001");
        assert_eq!(b(999), "checkpoints#orders#000010");
    }

    #[test]
    fn a_transaction_holds_at_most_100_items() {
        let topic = |n: i32, step: i32| -> Vec<SourcePartition> {
            (0..n)
                .map(|p| SourcePartition::new("t", p * step))
                .collect()
        };
        // 1,000 consecutive partitions: 11 buckets, one transaction.
        assert_eq!(split(&topic(1000, 1), 0, &[]), vec![1000]);
        // One bucket per partition: 99 buckets and the pending batch.
        assert_eq!(split(&topic(250, 96), 0, &[]), vec![99, 99, 52]);
        // Mirror mode: an item per partition too.
        assert_eq!(split(&topic(100, 1), 1, &[]), vec![97, 3]);
        assert!(split(&[], 0, &[]).is_empty());
        // Room for an item per stateful partition, 64 at most per transaction (each at most 32 KB:
        // 14 partitions with the old layout's 300 KB states were one transaction over
        // DynamoDB's 4 MB, refused on every retry).
        assert_eq!(split(&topic(14, 1), 0, &[true; 14]), vec![14]);
        assert_eq!(split(&topic(100, 1), 0, &[true; 100]), vec![64, 36]);
        // Stateless partitions between them fill the rest of the 100 items.
        let mixed: Vec<bool> = (0..120).map(|p| p % 20 == 0).collect();
        assert_eq!(split(&topic(120, 1), 0, &mixed), vec![120]);
    }
}
