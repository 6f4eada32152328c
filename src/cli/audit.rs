//! `streamtable audit`: per topic-partition, the offsets found in the topic's table and in
//! `dead_letters`, and any offset missing or found twice ([`crate::audit`]). Exit code 1 on
//! either.

use std::fmt::Write;

use crate::audit::{Audit, MAX_LISTED};
use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};

/// Arguments of `streamtable audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Audit only this topic's table (default: every one).
    #[arg(long)]
    pub table: Option<String>,
    /// Audit each partition from its first offset stamped at or after this time on: RFC 3339
    /// (2026-11-29T10:00:00Z), epoch milliseconds, or an age (`24h`, `7d`, `90m`).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Do not audit this table (repeatable); a table that cannot be audited (an upsert table
    /// whose partitions have no ledger yet, a data file that cannot be read) fails the audit
    /// otherwise.
    #[arg(long, value_name = "TABLE")]
    pub skip: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Also compare each topic-partition with its own log on this Kafka cluster
    /// (`host:port[,host:port…]`): every committed record below the checkpoint must be in the
    /// table or dead_letters. Reads each partition's log up to its checkpoint.
    #[arg(long, value_name = "BROKERS")]
    pub bootstrap_servers: Option<String>,
    /// The event source mapping's on-failure destination, where it writes the batches it gave
    /// up on: `s3://bucket[/prefix]` or a directory (default: the embedded home's
    /// `failed-batches/` when there is one). Offsets between landed batches are counted as
    /// skipped only where such a batch holds them; without it they are Kafka's gaps (an event
    /// source skips a batch only after writing it there, or retries it until it lands).
    #[arg(long, value_name = "LOCATION", env = "STREAMTABLE_FAILED_BATCHES")]
    pub failed_batches: Option<String>,
    /// A librdkafka property for --bootstrap-servers, `name=value` (repeatable), e.g.
    /// `-X security.protocol=sasl_ssl`.
    #[arg(short = 'X', long = "kafka-option", value_name = "NAME=VALUE")]
    pub kafka_options: Vec<String>,
}

/// Runs the audit and prints it; an error when an offset is missing or found twice.
pub async fn run(config: &Config, args: &AuditArgs) -> Result<()> {
    let backend = Backend::connect(&config.backend).await?;
    let spec = config.load_pipeline_resolved(&backend).await?;
    let log = match &args.bootstrap_servers {
        Some(servers) => {
            let mut connection = crate::broker::Connection::plaintext(servers);
            connection.options = args.kafka_options.clone();
            Some(crate::broker::log::KafkaLog::new(connection)?)
        }
        None if !args.kafka_options.is_empty() => {
            return Err(Error::Config(
                "audit: -X sets a Kafka property for --bootstrap-servers, which is not given"
                    .into(),
            ));
        }
        None => None,
    };
    let failed = args
        .failed_batches
        .clone()
        .or_else(|| match &config.backend {
            crate::backend::BackendConfig::Embedded { home } => {
                let dir = home.join("failed-batches");
                dir.is_dir().then(|| dir.display().to_string())
            }
            #[allow(unreachable_patterns)]
            _ => None,
        });
    let given_up = match &failed {
        Some(location) => Some(crate::audit::given_up::read(location).await?),
        None => None,
    };
    let since_ms = args
        .since
        .as_deref()
        .map(|t| since(t, crate::clock::now_ms()))
        .transpose()?;
    let audit = crate::audit::audit_with(
        &backend,
        &spec,
        &crate::audit::AuditOptions {
            only: args.table.as_deref(),
            since_ms,
            log: log.as_ref().map(|l| l as &dyn crate::audit::TopicLog),
            given_up: given_up.as_ref(),
            skip: &args.skip,
        },
    )
    .await?;
    let mut audit = audit;
    audit.failed_batches = match (&failed, &given_up) {
        (Some(location), Some(g)) => Some(crate::audit::FailedBatchesRead {
            location: location.clone(),
            batches: g.batches,
            unreadable: g.unreadable.clone(),
        }),
        _ => None,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&audit).map_err(|e| Error::Internal(e.to_string()))?
        );
    } else {
        print!("{}", render(&audit));
    }
    if audit.ok() {
        return Ok(());
    }
    let (missing, twice, not_landed): (i64, i64, i64) = audit
        .tables
        .iter()
        .flat_map(|t| &t.partitions)
        .fold((0, 0, 0), |(m, d, n), p| {
            (
                m + p.missing_offsets,
                d + p.duplicated_offsets,
                n + p.log.as_ref().map_or(0, |l| l.not_landed_offsets),
            )
        });
    Err(Error::Audit(format!(
        "{missing} offset(s) missing, {twice} found more than once, {not_landed} record(s) of the log in neither table (see above)"
    )))
}

/// The latest `--since` taken: the end of year 9999.
const MAX_SINCE_MS: i64 = 253_402_300_799_999;

/// `--since`: RFC 3339, epoch milliseconds, or an age before `now_ms` (`24h`, `7d`, `90m`),
/// between the epoch and the year 9999 (a Kafka timestamp of -1, "none", is before any).
pub fn since(text: &str, now_ms: i64) -> Result<i64> {
    let ms = since_unbounded(text, now_ms)?;
    if (0..=MAX_SINCE_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(Error::Config(format!(
            "--since {text:?} is {ms} ms, outside the epoch to the year 9999; give a time, or an age like 24h or 7d"
        )))
    }
}

fn since_unbounded(text: &str, now_ms: i64) -> Result<i64> {
    let t = text.trim();
    if let Ok(ms) = t.parse::<i64>() {
        return Ok(ms);
    }
    let unit = |u: char| match u {
        'm' => Some(60_000i64),
        'h' => Some(3_600_000),
        'd' => Some(86_400_000),
        _ => None,
    };
    if let Some(u) = t.chars().last().and_then(unit)
        && let Ok(n) = t[..t.len() - 1].parse::<i64>()
        && n >= 0
    {
        return Ok(now_ms.saturating_sub(n.saturating_mul(u)));
    }
    chrono::DateTime::parse_from_rfc3339(t)
        .map(|d| d.timestamp_millis())
        .map_err(|e| {
            Error::Config(format!(
                "--since {text:?}: {e}; use RFC 3339 like 2026-11-29T10:00:00Z, epoch milliseconds, or an age like 24h or 7d"
            ))
        })
}

/// `a..=b` ranges, comma-separated, the first few.
fn ranges(list: &[[i64; 2]]) -> String {
    let mut out: Vec<String> = list
        .iter()
        .take(10)
        .map(|[a, b]| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}..={b}")
            }
        })
        .collect();
    if list.len() > 10 {
        out.push(format!("… ({} ranges)", list.len()));
    }
    out.join(", ")
}

/// The audit as text for humans.
pub fn render(audit: &Audit) -> String {
    let mut out = String::new();
    for t in &audit.tables {
        let _ = writeln!(out, "table {} (topic {})", t.table, t.topic);
        for n in &t.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        if let Some(why) = &t.skipped {
            let _ = writeln!(out, "  not audited: {why}\n");
            continue;
        }
        if t.partitions.is_empty() {
            let _ = writeln!(out, "  no partition has landed yet\n");
            continue;
        }
        let _ = writeln!(
            out,
            "  {:>9} {:>24} {:>10} {:>12} {:>8} {:>9} {:>11}",
            "partition", "offsets", "rows", "dead letters", "pending", "missing", "found twice"
        );
        for p in &t.partitions {
            let offsets = format!("{}..{} ", p.verified_from, p.next_offset);
            let _ = writeln!(
                out,
                "  {:>9} {:>24} {:>10} {:>12} {:>8} {:>9} {:>11}",
                p.partition,
                offsets,
                p.rows,
                p.dead_letters,
                p.pending.len(),
                p.missing_offsets,
                p.duplicated_offsets
            );
            for [a, b] in &p.missing {
                let older = p.ledger_from.is_none_or(|from| *b < from);
                let _ = writeln!(
                    out,
                    "    missing: offsets {a}..={b} (in neither {} nor dead_letters{})",
                    t.table,
                    if older {
                        "; older than the ledger of delivered offsets, so a range Kafka itself skips — transaction markers, a compacted topic — also shows here"
                    } else {
                        ""
                    }
                );
            }
            if p.skipped_offsets > 0 {
                let _ = writeln!(
                    out,
                    "    {}skipped: {} offset(s) no landed batch took, in batches the event source gave up on: {} — `streamtable replay` lands them{}",
                    if p.log.is_some() { "" } else { "missing: " },
                    p.skipped_offsets,
                    ranges(&p.skipped),
                    if p.log.is_some() {
                        "; the log's verdict below"
                    } else {
                        "; --bootstrap-servers checks them against the log"
                    }
                );
            }
            if let Some(u) = &p.upsert {
                let unaccounted = u.unaccounted();
                let _ = writeln!(
                    out,
                    "    upsert: {} offset(s) of the delivered ranges hold no row (deleted or not) nor dead letter: {} Kafka's gaps, {} tombstones, {} rows compaction dropped{}",
                    u.holes,
                    u.gaps,
                    u.tombstones,
                    u.dropped,
                    match unaccounted {
                        0 => " — every delivered record accounted for".to_string(),
                        n if n > 0 =>
                            format!(" — missing: {n} record(s) delivered are none of these"),
                        n => format!(
                            " — {} more accounted for than delivered (a damaged count, or rows of offsets never delivered)",
                            -n
                        ),
                    }
                );
            }
            if let Some(why) = &p.ledger_error {
                let _ = writeln!(out, "    ledger: {why}");
            }
            for m in &p.short {
                let _ = writeln!(
                    out,
                    "    missing: {} of the {} records delivered in offsets {}..={} (a range with Kafka's gaps inside; {} found); the offsets found nowhere there: {}",
                    m.delivered - m.found,
                    m.delivered,
                    m.first,
                    m.last,
                    m.found,
                    ranges(&m.holes)
                );
            }
            for m in &p.surplus {
                let _ = writeln!(
                    out,
                    "    more than delivered: {} offsets found in {}..={}, where {} records were delivered (rows whose Kafka columns are wrong, or a damaged ledger)",
                    m.found, m.first, m.last, m.delivered
                );
            }
            if let Some(l) = &p.log {
                if l.not_landed_offsets > 0 {
                    let _ = writeln!(
                        out,
                        "    not landed: {} record(s) of the topic's log in neither {} nor dead_letters: {}",
                        l.not_landed_offsets,
                        t.table,
                        ranges(&l.not_landed)
                    );
                } else {
                    let _ = writeln!(
                        out,
                        "    the log (from offset {}): each of its {} committed record(s) below the checkpoint landed",
                        l.log_from, l.records
                    );
                }
                if l.before_first > 0 {
                    let _ = writeln!(
                        out,
                        "    the log holds {} record(s) below offset {}, where the check starts (the pipeline started after them, or lost them before its first landing)",
                        l.before_first, p.verified_from
                    );
                }
            }
            if p.not_delivered_offsets > 0 {
                let _ = writeln!(
                    out,
                    "    never delivered (not counted as missing): {} offset(s): {} — gaps of the topic's log (transaction markers, aborted or compacted records){}",
                    p.not_delivered_offsets,
                    ranges(&p.not_delivered),
                    match (&audit.failed_batches, &p.log) {
                        (_, Some(_)) => "; checked against the log above",
                        (Some(_), None) => {
                            "; no batch the event source gave up on holds them; --bootstrap-servers checks them against the log"
                        }
                        (None, None) => {
                            "; the batches the event source gave up on were not read (--failed-batches), nor the log (--bootstrap-servers)"
                        }
                    }
                );
            }
            if let Some([a, b]) = p.beyond_checkpoint {
                let _ = writeln!(
                    out,
                    "    beyond the checkpoint: offsets {a}..={b} are in the tables, yet the checkpoint is at {a}: it went back (a reset or a restored state table), and they will land again"
                );
            }
            for d in &p.duplicates {
                let _ = writeln!(
                    out,
                    "    found twice: offset {} ({} row(s) in {}, {} in dead_letters){}",
                    d.offset,
                    d.in_table,
                    t.table,
                    d.in_dead_letters,
                    if d.files.is_empty() {
                        String::new()
                    } else {
                        format!("; in {}", d.files.join(", "))
                    }
                );
            }
            if p.missing.len() >= MAX_LISTED || p.duplicates.len() >= MAX_LISTED {
                let _ = writeln!(out, "    (the first {MAX_LISTED} of each listed)");
            }
        }
        out.push('\n');
    }
    match &audit.failed_batches {
        Some(f) => {
            let _ = writeln!(
                out,
                "batches the event source gave up on: {} read from {}",
                f.batches, f.location
            );
            for u in &f.unreadable {
                let _ = writeln!(out, "  cannot be read: {u}");
            }
        }
        None => {
            let _ = writeln!(
                out,
                "batches the event source gave up on: not read (--failed-batches, its on-failure destination)"
            );
        }
    }
    for u in &audit.unreadable_pending {
        let _ = writeln!(
            out,
            "pending batch that cannot be read: {u} (its offsets may show as missing above)"
        );
    }
    let _ = writeln!(
        out,
        "(each partition is checked from its lowest offset found or delivered: a loss below it is not seen)"
    );
    let _ = writeln!(
        out,
        "{}",
        if audit.ok() {
            "audit: every offset delivered below each checkpoint, but the pending batches', is in its table or dead_letters exactly once"
        } else {
            "audit: FAILED"
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::since;

    #[test]
    fn since_takes_a_time_or_an_age() {
        assert_eq!(
            since("2026-11-29T10:00:00Z", 0).expect("rfc3339"),
            1_795_946_400_000
        );
        assert_eq!(since("1000", 0).expect("ms"), 1000);
        assert_eq!(
            since("2h", 10_000_000).expect("age"),
            10_000_000 - 7_200_000
        );
        assert_eq!(
            since("7d", 1_000_000_000).expect("days"),
            1_000_000_000 - 604_800_000
        );
        assert!(
            since("120000000d", 1_000_000_000_000).is_err(),
            "before the epoch"
        );
        assert!(since("9300000000000000", 0).is_err(), "after the year 9999");
        let e = since("yesterday", 0).expect_err("refused").to_string();
        assert!(
            e.contains("--since \"yesterday\"") && e.contains("24h"),
            "{e}"
        );
    }
}
