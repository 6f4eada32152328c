//! What `streamtable run` shows while it runs: a status line on a terminal (records, batches,
//! dead letters, lag per partition, records behind open transactions), plain lines otherwise.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::source::RunReport;

/// Per partition: its lag (`None` before librdkafka reported its end) and the records past
/// the last stable offset (in transactions still open).
pub(crate) type Lags = Vec<((String, i32), Option<i64>, i64)>;

/// Progress on the terminal: a status line redrawn every second, or a plain line every ten
/// seconds when standard error is not a terminal.
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    last: Mutex<Option<Instant>>,
}

impl Progress {
    pub(crate) fn new() -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.enable_steady_tick(Duration::from_millis(250));
            bar
        });
        Progress {
            bar,
            last: Mutex::new(None),
        }
    }

    fn line(report: &RunReport, lags: &Lags, started: Instant) -> String {
        let secs = started.elapsed().as_secs_f64().max(1e-3);
        let total: i64 = lags.iter().filter_map(|(_, l, _)| *l).sum();
        let open: i64 = lags.iter().map(|(_, _, o)| *o).sum();
        let unknown = lags.iter().filter(|(_, l, _)| l.is_none()).count();
        let mut worst: Vec<&((String, i32), Option<i64>, i64)> = lags
            .iter()
            .filter(|(_, l, _)| l.is_some_and(|l| l > 0))
            .collect();
        worst.sort_by_key(|(_, l, _)| std::cmp::Reverse(l.unwrap_or(0)));
        let worst: Vec<String> = worst
            .iter()
            .take(4)
            .map(|((t, p), l, _)| format!("{t}/{p}={}", l.unwrap_or(0)))
            .collect();
        format!(
            "{} records in {} batches ({:.0}/s), {} dead letters; lag {total}{}{}{}",
            report.ingest.records,
            report.batches,
            report.ingest.records as f64 / secs,
            report.ingest.dead_lettered,
            if open > 0 {
                format!(" (+{open} records behind open transactions, not readable yet)")
            } else {
                String::new()
            },
            if unknown > 0 {
                format!(" (+{unknown} partitions not read yet)")
            } else {
                String::new()
            },
            if worst.is_empty() {
                String::new()
            } else {
                format!(" [{}]", worst.join(" "))
            }
        )
    }

    pub(crate) fn tick(&self, report: &RunReport, lags: &Lags, started: Instant) {
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        let every = if self.bar.is_some() { 1 } else { 10 };
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(every)) {
            return;
        }
        *last = Some(Instant::now());
        let line = Self::line(report, lags, started);
        match &self.bar {
            Some(bar) => bar.set_message(line),
            None => eprintln!("{line}"),
        }
    }

    pub(crate) fn lines(&self, what: &str, lines: &[String]) {
        for l in lines {
            match &self.bar {
                Some(bar) => bar.println(format!("{what}: {l}")),
                None => eprintln!("{what}: {l}"),
            }
        }
    }

    pub(crate) fn finish(&self, report: &RunReport, lags: &Lags, started: Instant) {
        let line = Self::line(report, lags, started);
        match &self.bar {
            Some(bar) => bar.finish_with_message(line),
            None => eprintln!("{line}"),
        }
    }
}
