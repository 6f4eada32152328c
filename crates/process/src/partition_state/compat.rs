//! What a changed derived table does with the state an earlier plan wrote.
//!
//! Each table's state records what its plan keeps in it ([`PlanSig`]: the window, the `GROUP
//! BY` keys, the aggregates in the order their accumulators are stored, the dedup key). When
//! the current plan differs, [`adopt`] decides per part of the state:
//!
//! - **carried over** where the stored values still mean what the new plan needs: the same
//!   window and keys with aggregates added, removed, reordered or renamed (accumulators are
//!   matched by what they compute, not by position; a new aggregate starts empty at the change,
//!   so the windows open then count it only from the change on), a changed `WHERE` (the open
//!   windows hold records of both filters), the same dedup key with another `within`;
//! - **restarted** where they do not: another window (size, slide, gap or kind), other `GROUP
//!   BY` keys, another dedup key. The open windows (or keys) are dropped — their partial rows
//!   are never written — and the new plan starts empty. `streamtable check` refuses such a
//!   change against the live state unless told to accept it, and says how to deploy it
//!   without loss (a new table name).
//!
//! A state recorded by the current plan is taken as it is (only that plan can have written it,
//! and a batch must not cost a walk over every stored key). Any other state is checked window
//! by window and key by key: one whose keys or accumulators do not fit the plan is dropped with
//! the reason. The windows' code reads stored keys and accumulators with bounds checks either
//! way: a misfit is a failed row, never a panic.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::discriminant;

use serde::{Deserialize, Serialize};

use super::{Acc, TableState};

/// What a derived table's plan keeps in its state, as recorded with the state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanSig {
    /// The window (`tumbling 1 min`); `None`: the table has no window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// The `GROUP BY` keys besides the window, as planned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// What each stored accumulator computes, in stored order (`sum(t.amount) of Int64`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aggs: Vec<String>,
    /// The output column of each aggregate (same order), for messages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// The `WHERE`, as planned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// The dedup key columns with their types; empty: no dedup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dedup: Vec<String>,
}

/// What happened to one table's state in one partition when it met the current plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adoption {
    /// Changes carried over, each with what it means for the state open at the change.
    pub carried: Vec<String>,
    /// Why parts of the state were dropped.
    pub restarted: Vec<String>,
    /// Open windows carried over (with [`Adoption::carried`] notes).
    pub windows_kept: usize,
    /// Open windows dropped.
    pub windows_dropped: usize,
    /// Dedup keys kept.
    pub keys_kept: usize,
    /// Dedup keys dropped.
    pub keys_dropped: usize,
}

impl Adoption {
    /// The state was written by this very plan (or holds nothing) and nothing changed.
    pub fn is_same(&self) -> bool {
        self.carried.is_empty() && self.restarted.is_empty()
    }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Brings `state` to the plan `current` (whose empty accumulators are `fresh`, one per
/// aggregate), carrying over what is sound and dropping the rest, and records `current` as the
/// state's plan. Pure: the same inputs give the same state.
pub fn adopt(state: &mut TableState, current: &PlanSig, fresh: &[Acc]) -> Adoption {
    let mut out = Adoption::default();
    let windows = state.open.len();
    let keys = state.keys.len() as usize;
    match state.plan.take() {
        // Written by this very plan: it fits (every window and key was made by it), and a
        // batch costs no walk over the state.
        Some(old) if old == *current => {
            state.plan = Some(old);
            out.windows_kept = windows;
            out.keys_kept = keys;
            return out;
        }
        Some(old) => {
            // Windows.
            if windows > 0 {
                if old.window != current.window {
                    out.restarted.push(format!(
                        "the window changed ({} → {})",
                        old.window.as_deref().unwrap_or("none"),
                        current.window.as_deref().unwrap_or("none")
                    ));
                    state.open.clear();
                } else if old.keys != current.keys {
                    out.restarted.push(format!(
                        "GROUP BY changed ({} → {})",
                        list(&old.keys),
                        list(&current.keys)
                    ));
                    state.open.clear();
                } else {
                    carry_aggregates(state, &old, current, fresh, &mut out);
                    if old.filter != current.filter {
                        out.carried.push(
                            "WHERE changed: windows open at the change hold records of both filters"
                                .into(),
                        );
                    }
                }
            }
            // Dedup keys.
            if keys > 0 && old.dedup != current.dedup {
                out.restarted.push(format!(
                    "the dedup key changed ({} → {}): a record that duplicates one from before the change lands again",
                    list(&old.dedup),
                    list(&current.dedup)
                ));
                state.keys.clear();
            }
        }
        // Written before plans were recorded: kept where it fits (below).
        None => {}
    }
    // Whatever the record says, a window or key that does not fit the plan is dropped, never
    // misread.
    let (width, count) = (current.keys.len(), fresh.len());
    let before = state.open.len();
    state.open.retain(|w| {
        current.window.is_some()
            && w.key.len() == width
            && w.accs.len() == count
            && w.accs
                .iter()
                .zip(fresh)
                .all(|(a, f)| discriminant(a) == discriminant(f))
    });
    if state.open.len() < before {
        out.restarted.push(format!(
            "{} open windows do not fit the plan (another number or kind of keys or aggregates)",
            before - state.open.len()
        ));
    }
    // Keys are stored hashed: one of another width never matches a current key (and expires
    // with its run); a plan without a dedup keeps none.
    if current.dedup.is_empty() && !state.keys.is_empty() {
        out.restarted.push(format!(
            "{} dedup keys do not fit the plan (it has no dedup)",
            state.keys.len()
        ));
        state.keys.clear();
    }
    out.windows_kept = state.open.len();
    out.windows_dropped = windows - out.windows_kept;
    out.keys_kept = state.keys.len() as usize;
    out.keys_dropped = keys - out.keys_kept;
    state.plan = Some(current.clone());
    out
}

/// Same window and keys: accumulators matched by what they compute.
fn carry_aggregates(
    state: &mut TableState,
    old: &PlanSig,
    current: &PlanSig,
    fresh: &[Acc],
    out: &mut Adoption,
) {
    let mut used = vec![false; old.aggs.len()];
    let mapping: Vec<Option<usize>> = current
        .aggs
        .iter()
        .map(|a| {
            let j = (0..old.aggs.len()).find(|&j| !used[j] && old.aggs[j] == *a)?;
            used[j] = true;
            Some(j)
        })
        .collect();
    let name = |names: &[String], i: usize, aggs: &[String]| {
        names
            .get(i)
            .cloned()
            .unwrap_or_else(|| aggs.get(i).cloned().unwrap_or_default())
    };
    for (i, m) in mapping.iter().enumerate() {
        match m {
            None => out.carried.push(format!(
                "new aggregate `{}` starts at the change: windows open then count it only from there",
                name(&current.names, i, &current.aggs)
            )),
            Some(j) => {
                let (was, is) = (
                    name(&old.names, *j, &old.aggs),
                    name(&current.names, i, &current.aggs),
                );
                if was != is {
                    out.carried.push(format!("`{was}` is now `{is}`"));
                }
            }
        }
    }
    for (j, u) in used.iter().enumerate() {
        if !u {
            out.carried.push(format!(
                "aggregate `{}` is no longer computed",
                name(&old.names, j, &old.aggs)
            ));
        }
    }
    let identity =
        mapping.len() == old.aggs.len() && mapping.iter().enumerate().all(|(i, m)| *m == Some(i));
    if identity {
        return;
    }
    for w in &mut state.open {
        let mut old_accs: Vec<Option<Acc>> =
            std::mem::take(&mut w.accs).into_iter().map(Some).collect();
        w.accs = mapping
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.and_then(|j| old_accs.get_mut(j).and_then(Option::take))
                    .or_else(|| fresh.get(i).cloned())
                    .unwrap_or(Acc::Count(0))
            })
            .collect();
    }
}

/// What the current plans do with the state of many partitions, per table: what
/// `streamtable check` shows against the live state.
#[derive(Debug, Clone, Default)]
pub struct StateChanges {
    /// Partitions whose state was looked at.
    pub partitions: usize,
    tables: BTreeMap<String, TableChanges>,
}

#[derive(Debug, Clone, Default)]
struct TableChanges {
    partitions: usize,
    windows_kept: usize,
    windows_dropped: usize,
    keys_kept: usize,
    keys_dropped: usize,
    carried: BTreeSet<String>,
    restarted: BTreeSet<String>,
    /// The table is not in the spec any more.
    unknown: bool,
}

impl StateChanges {
    /// Adds what adopting one partition's state of `table` did.
    pub fn add(&mut self, table: &str, a: &Adoption) {
        let t = self.tables.entry(table.to_string()).or_default();
        t.partitions += 1;
        t.windows_kept += a.windows_kept;
        t.windows_dropped += a.windows_dropped;
        t.keys_kept += a.keys_kept;
        t.keys_dropped += a.keys_dropped;
        t.carried.extend(a.carried.iter().cloned());
        t.restarted.extend(a.restarted.iter().cloned());
    }

    /// A table the spec no longer has keeps state in one more partition.
    pub fn add_unknown(&mut self, table: &str) {
        let t = self.tables.entry(table.to_string()).or_default();
        t.partitions += 1;
        t.unknown = true;
    }

    /// Whether any table's state changes.
    pub fn is_empty(&self) -> bool {
        self.tables
            .values()
            .all(|t| !t.unknown && t.carried.is_empty() && t.restarted.is_empty())
    }

    /// One line per changed table; lines of tables that would drop state start with `!`.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, t) in &self.tables {
            let p = t.partitions;
            if t.unknown {
                out.push(format!(
                    "{name}: no longer in the spec; its state in {p} partitions is kept for a day after it was last written (a release that still runs it may own it), then dropped"
                ));
                continue;
            }
            if !t.restarted.is_empty() {
                let mut lost = Vec::new();
                if t.windows_dropped > 0 {
                    lost.push(format!(
                        "{} open windows (their partial rows are never written)",
                        t.windows_dropped
                    ));
                }
                if t.keys_dropped > 0 {
                    lost.push(format!("{} dedup keys", t.keys_dropped));
                }
                out.push(format!(
                    "! {name}: {}: would drop {} in {p} partitions; to keep them, deploy the new SQL as a new table (a new name) beside this one and remove this one once its windows closed",
                    t.restarted.iter().cloned().collect::<Vec<_>>().join("; "),
                    lost.join(" and ")
                ));
            }
            if !t.carried.is_empty() {
                out.push(format!(
                    "{name}: {} open windows in {p} partitions carried over; {}",
                    t.windows_kept,
                    t.carried.iter().cloned().collect::<Vec<_>>().join("; ")
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition_state::OpenWindow;
    use crate::value::Value;

    fn sig(aggs: &[&str], names: &[&str]) -> PlanSig {
        PlanSig {
            window: Some("tumbling 1 min".into()),
            keys: vec!["t.k".into()],
            aggs: aggs.iter().map(|s| s.to_string()).collect(),
            names: names.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn window(accs: Vec<Acc>) -> OpenWindow {
        OpenWindow {
            start: 0,
            end: None,
            key: vec![Value::Str("a".into())],
            accs,
        }
    }

    #[test]
    fn an_added_aggregate_starts_empty_and_the_others_are_carried_by_what_they_compute() {
        let v1 = sig(&["count(*)", "sum(t.x) of Int64"], &["n", "s"]);
        let mut state = TableState {
            plan: Some(v1),
            open: vec![window(vec![Acc::Count(3), Acc::SumInt(Some(7))])],
            ..Default::default()
        };
        // v2 reorders, renames n, adds max.
        let v2 = sig(
            &["sum(t.x) of Int64", "max(t.x) of Int64", "count(*)"],
            &["s", "m", "cnt"],
        );
        let mut check = StateChanges::default();
        let fresh = [Acc::SumInt(None), Acc::Max(Value::Null), Acc::Count(0)];
        let a = adopt(&mut state, &v2, &fresh);
        assert_eq!(
            state.open[0].accs,
            vec![Acc::SumInt(Some(7)), Acc::Max(Value::Null), Acc::Count(3)]
        );
        assert!(a.restarted.is_empty(), "{a:?}");
        assert!(
            a.carried.iter().any(|c| c.contains("new aggregate `m`")),
            "{a:?}"
        );
        assert!(
            a.carried.iter().any(|c| c.contains("`n` is now `cnt`")),
            "{a:?}"
        );
        assert_eq!((a.windows_kept, a.windows_dropped), (1, 0));
        assert_eq!(state.plan.as_ref(), Some(&v2));
        check.add("t", &a);
        let lines = check.lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("t: 1 open windows in 1 partitions carried over; "),
            "{lines:?}"
        );
        assert!(
            lines[0].contains("new aggregate `m` starts at the change"),
            "{lines:?}"
        );
        // The same plan again changes nothing.
        let again = adopt(&mut state, &v2, &fresh);
        assert!(again.is_same(), "{again:?}");
    }

    #[test]
    fn another_window_or_key_restarts_and_says_why() {
        let v1 = sig(&["count(*)"], &["n"]);
        let mut state = TableState {
            plan: Some(v1.clone()),
            open: vec![window(vec![Acc::Count(3)])],
            ..Default::default()
        };
        let mut v2 = v1.clone();
        v2.window = Some("tumbling 5 min".into());
        let a = adopt(&mut state, &v2, &[Acc::Count(0)]);
        assert!(state.open.is_empty());
        assert_eq!((a.windows_kept, a.windows_dropped), (0, 1));
        assert!(
            a.restarted[0].contains("tumbling 1 min → tumbling 5 min"),
            "{a:?}"
        );
        let mut check = StateChanges::default();
        check.add("t", &a);
        assert!(
            check.lines()[0].starts_with("! t: the window changed"),
            "{:?}",
            check.lines()
        );
        assert!(
            check.lines()[0].contains("would drop 1 open windows"),
            "{:?}",
            check.lines()
        );
    }

    #[test]
    fn state_that_does_not_fit_is_dropped_never_misread() {
        // Written before plans were recorded, by a plan with one aggregate; the current one has
        // two: the old windows cannot be read by position.
        let mut state = TableState {
            plan: None,
            open: vec![window(vec![Acc::Count(3)])],
            keys: crate::partition_state::Keys::migrate(&[(vec![Value::Str("o-1".into())], 5)]),
            ..Default::default()
        };
        let v2 = PlanSig {
            dedup: vec!["id Utf8".into()],
            ..sig(&["count(*)", "sum(t.x) of Int64"], &["n", "s"])
        };
        let a = adopt(&mut state, &v2, &[Acc::Count(0), Acc::SumInt(None)]);
        assert!(state.open.is_empty());
        assert_eq!(a.windows_dropped, 1);
        assert_eq!(a.keys_kept, 1, "the dedup key fits: {a:?}");
        // A fitting legacy state is adopted as it is.
        let mut fits = TableState {
            open: vec![window(vec![Acc::Count(3)])],
            ..Default::default()
        };
        let v1 = sig(&["count(*)"], &["n"]);
        let a = adopt(&mut fits, &v1, &[Acc::Count(0)]);
        assert!(a.is_same(), "{a:?}");
        assert_eq!(fits.open.len(), 1);
        // A changed record with an accumulator of another kind in the same place is dropped
        // too (the plan's record says `count`, the stored value is a sum).
        let mut wrong = TableState {
            plan: Some(sig(&["count(*)"], &["other"])),
            open: vec![window(vec![Acc::SumInt(None)])],
            ..Default::default()
        };
        let a = adopt(&mut wrong, &v1, &[Acc::Count(0)]);
        assert_eq!(a.windows_dropped, 1, "{a:?}");
    }

    #[test]
    fn a_changed_dedup_key_drops_the_keys() {
        let v1 = PlanSig {
            dedup: vec!["id Utf8".into()],
            ..Default::default()
        };
        let mut state = TableState {
            plan: Some(v1),
            keys: crate::partition_state::Keys::migrate(&[(vec![Value::Str("o-1".into())], 5)]),
            ..Default::default()
        };
        let v2 = PlanSig {
            dedup: vec!["id Utf8".into(), "shop Utf8".into()],
            ..Default::default()
        };
        let a = adopt(&mut state, &v2, &[]);
        assert!(state.keys.is_empty());
        assert_eq!(a.keys_dropped, 1);
        assert!(a.restarted[0].contains("dedup key changed"), "{a:?}");
    }
}
