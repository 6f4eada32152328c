//! `streamtable-bench`: benchmarks that print numbers (never timed assertions in tests), run
//! from the repository (`cargo run --release -p streamtable-bench -- <benchmark>`; the scripts
//! `scripts/bench` and `scripts/bench-moto` wrap it). They drive the same library code the
//! Lambda functions and the command line run.

mod audit;
mod broker;
mod compact;
mod cost;
mod formats;
mod freshness;
mod ingest;
mod process;
mod reference;
mod scale;
mod state;
mod system;
mod upsert;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use streamtable::{
    aws, backend, checkpoint, cli, clock, commit, config, decode, error, esm, generate, kafka,
    registry, scheduled, spec, table, tables,
};

use crate::config::Config;
use crate::error::{Error, Result};

#[derive(Parser)]
#[command(
    name = "streamtable-bench",
    version,
    about = "streamtable's benchmarks: they print numbers"
)]
struct Args {
    /// Pipeline spec (default: infra/pipeline.toml if present, else the built-in copy).
    #[arg(long, global = true, env = "STREAMTABLE_PIPELINE")]
    pipeline: Option<PathBuf>,
    /// Home of the embedded backend: state.db, catalog.db and warehouse/.
    #[arg(long, global = true, env = "STREAMTABLE_HOME")]
    home: Option<PathBuf>,
    /// Backend: embedded (default, no AWS needed) or aws.
    #[arg(long, global = true, env = "STREAMTABLE_BACKEND")]
    backend: Option<String>,
    #[command(subcommand)]
    which: BenchCommand,
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    streamtable::telemetry::init_cli_logs();
    let args = Args::parse();
    let result = async {
        let config = cli::config_from_flags(
            args.pipeline.as_deref(),
            args.home.as_deref(),
            args.backend.as_deref(),
        )?;
        run(&config, &args.which).await
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Which benchmark.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// One full ESM batch of orders: event JSON to Parquet bytes in memory, then end to end on
    /// the embedded backend (files + checkpoint), then peak RSS of one invocation.
    Ingest {
        /// Records per batch.
        #[arg(long, default_value_t = 10_000)]
        records: u64,
        /// Kafka partitions in the batch.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
        /// Timed iterations (the median is reported).
        #[arg(long, default_value_t = 15)]
        iterations: usize,
    },
    /// Record formats: the 10,000-order batch as JSON, Confluent-framed Avro and Confluent-framed
    /// Protobuf (the same records), decoded and encoded to Parquet in memory by one invocation.
    Formats {
        /// Records per batch.
        #[arg(long, default_value_t = 10_000)]
        records: u64,
        /// Kafka partitions in the batch.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
        /// Timed iterations (the median is reported).
        #[arg(long, default_value_t = 20)]
        iterations: usize,
    },
    /// Derived tables: the 10,000-order batch with `orders_clean` (lookup join, filter,
    /// projection) against the topic's table alone; the ingest Lambda's start to its first
    /// Runtime API poll with the SQL planned; the size of the ingest binary.
    Process {
        /// Records per batch.
        #[arg(long, default_value_t = 10_000)]
        records: u64,
        /// Kafka partitions in the batch.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
        /// Timed iterations (the median is reported).
        #[arg(long, default_value_t = 15)]
        iterations: usize,
        /// The ingest Lambda binary (default: `ingest` next to this executable).
        #[arg(long)]
        ingest_binary: Option<PathBuf>,
    },
    /// Stateful derived tables as their state fills: random 128-bit order ids, the shipped
    /// spec's dedup within an hour and 1-minute window; per step of event time the time per
    /// batch, state bytes written, S3 PUTs and DynamoDB write units per batch, state stored,
    /// and a cold container's load time and peak RSS.
    State {
        /// Orders per second of event time (one run each).
        #[arg(long, value_delimiter = ',', default_values_t = vec![200, 1000])]
        rates: Vec<u64>,
        /// Kafka partitions (one run each).
        #[arg(long, value_delimiter = ',', default_values_t = vec![4, 64])]
        partitions: Vec<i32>,
        /// Hours of event time.
        #[arg(long, default_value_t = 2.0)]
        hours: f64,
        /// Records per ESM batch.
        #[arg(long, default_value_t = 10_000)]
        batch: u64,
        /// Minutes of event time per reported step.
        #[arg(long, default_value_t = 10)]
        step_minutes: u64,
        /// The interval join instead (orders ⋈ payments within an hour, a commit round per
        /// minute of event time), at each rate and width.
        #[arg(long)]
        join: bool,
    },
    /// Loads every partition's state as a cold container would, then prints the time and peak
    /// RSS (used by `bench state`).
    #[command(hide = true)]
    StateLoad {
        /// Home of the embedded backend holding the state.
        #[arg(long)]
        home: PathBuf,
    },
    /// One invocation on an event file, then the process's peak RSS (used by `bench ingest`).
    #[command(hide = true)]
    IngestOnce {
        #[arg(long)]
        /// The ESM event file to ingest.
        event: PathBuf,
        /// Print one JSON object instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// Compaction of many 1-5 MB files into target-size files: throughput and peak RSS.
    Compact {
        /// Total size of the small files to rewrite, in MB.
        #[arg(long, default_value_t = 1024)]
        total_mb: u64,
        /// Target size of the compacted files, in MB.
        #[arg(long, default_value_t = 128)]
        target_mb: u64,
        /// Decode and re-encode every row group (what small micro-files get) instead of
        /// copying large row groups.
        #[arg(long)]
        reencode: bool,
    },
    /// Compacts the table prepared in HOME, then prints peak RSS (used by `bench compact`).
    #[command(hide = true)]
    CompactOnce {
        #[arg(long)]
        /// Directory of the scratch embedded backend.
        home: PathBuf,
        #[arg(long)]
        /// Megabytes of micro-files to compact.
        target_mb: u64,
        #[arg(long)]
        /// Re-encode every row group (no byte-for-byte copies).
        reencode: bool,
        /// Print one JSON object instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// Upsert tables: the same status changes into an append and an upsert table (ingest and
    /// commit throughput), the upsert table read before and after compaction, its key index size.
    Upsert {
        /// Records (status changes).
        #[arg(long, default_value_t = 200_000)]
        records: u64,
        /// Distinct orders (keys) they change.
        #[arg(long, default_value_t = 20_000)]
        keys: u64,
        /// Records per ESM batch.
        #[arg(long, default_value_t = 10_000)]
        batch: u64,
        /// Batches per commit round.
        #[arg(long, default_value_t = 2)]
        rounds_of: usize,
    },
    /// `streamtable audit`'s cost per million rows: orders landed, committed and compacted,
    /// then audited (median of 3).
    Audit {
        /// Records (orders) to land and audit.
        #[arg(long, default_value_t = 1_000_000)]
        records: u64,
    },
    /// Scale of the scheduled stage: for each backlog, that many ESM batches of each of the
    /// shipped spec's order topics (orders, payments, order_status), then ONE scheduled run in a
    /// fresh process: wall time, CPU, peak RSS and throughput in MB/s of event JSON.
    Scale {
        /// Backlogs to measure, in ESM batches per topic (one fresh home each).
        #[arg(long, value_delimiter = ',', default_values_t = vec![30, 60])]
        backlogs: Vec<u64>,
        /// Records per batch.
        #[arg(long, default_value_t = 10_000)]
        records: u64,
        /// Kafka partitions of each topic.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
        /// Keep each home (its path is printed).
        #[arg(long)]
        keep: bool,
        /// Instead: an unpartitioned upsert table of each of these many keys, then
        /// `--changes` changes of existing keys committed by one cold scheduled run.
        #[arg(long, value_delimiter = ',')]
        upsert_keys: Vec<u64>,
        /// Changes of existing keys (with `--upsert-keys`).
        #[arg(long, default_value_t = 10_000)]
        changes: u64,
    },
    /// One scheduled run on HOME, printed as a JSON line (used by `bench scale`).
    #[command(hide = true)]
    ScaleOnce {
        /// Home of the embedded backend with the backlog.
        #[arg(long)]
        home: PathBuf,
    },
    /// Time to commit many pending files on the embedded backend.
    Commit {
        /// Pending files to commit.
        #[arg(long, default_value_t = 1000)]
        files: u64,
    },
    /// Requests and dollars per GB of event JSON for ingest, commit and compaction, at several
    /// Kafka partition counts per batch; needs the counting proxy (`scripts/bench-moto`).
    Cost {
        /// Kafka partitions per ESM batch, one run each.
        #[arg(long, value_delimiter = ',', default_value = "4,64,1000")]
        partitions: Vec<i32>,
        /// ESM batches ingested per run (one commit and one compaction follow).
        #[arg(long, default_value_t = 20)]
        batches: u64,
        /// Scheduled runs counted: `batches` batches, a commit and a compaction, this many
        /// times (the warm-up of `--processing` runs the scheduled stage at the same cadence).
        #[arg(long, default_value_t = 1)]
        cycles: u64,
        /// Records per batch.
        #[arg(long, default_value_t = 10_000)]
        records: u64,
        /// With the spec's derived tables over orders and payments (dedup, window, interval
        /// join): orders with random ids and a batch of their payments per step.
        #[arg(long)]
        processing: bool,
    },
    /// Event → queryable latency over a steady stream with commits triggered by landed
    /// batches (p50/p99), on the embedded backend or on moto (`--moto`).
    Freshness {
        /// How long the stream runs.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Orders per second.
        #[arg(long, default_value_t = 2000)]
        rate: u64,
        /// The ESM's batching window: records are handed to ingest this often.
        #[arg(long, default_value_t = 1000)]
        window_ms: u64,
        /// Least seconds between two commits (`STREAMTABLE_COMMIT_INTERVAL_S`).
        #[arg(long, default_value_t = 10)]
        interval_s: u64,
        /// On moto (the aws backend at `AWS_ENDPOINT_URL`) instead of the embedded backend.
        #[arg(long)]
        moto: bool,
    },
    /// A real Kafka broker (e.g. scripts/kafka-local) to committed tables through the local
    /// event source mapping, next to `streamtable ingest` of the same records from event
    /// files; then the time the lag takes to return to zero after a steady producer stops.
    Kafka {
        /// The broker, host:port.
        #[arg(long)]
        bootstrap_servers: String,
        /// Records.
        #[arg(long, default_value_t = 200_000)]
        records: u64,
        /// Partitions of the topic.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
        /// `BatchSize`.
        #[arg(long, default_value_t = 10_000)]
        batch_size: u32,
        /// Records per second of the steady producer (lag measurement).
        #[arg(long, default_value_t = 5_000)]
        rate: u64,
        /// Seconds the steady producer runs.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// streamtable against the Python Lambda a team would write instead (pyarrow + pyiceberg,
    /// in bench/reference/), on the same inputs in one run, with ratios: ingest, compaction,
    /// the demo at scale, and the ingest Lambda's init time and size. `scripts/bench` runs it.
    Reference(reference::ReferenceArgs),
}

/// Runs a benchmark.
async fn run(config: &Config, which: &BenchCommand) -> Result<()> {
    match which {
        BenchCommand::Ingest {
            records,
            partitions,
            iterations,
        } => ingest::ingest(config, *records, *partitions, (*iterations).max(1)).await,
        BenchCommand::Process {
            records,
            partitions,
            iterations,
            ingest_binary,
        } => {
            process::process(
                config,
                *records,
                *partitions,
                (*iterations).max(1),
                ingest_binary.as_deref(),
            )
            .await
        }
        BenchCommand::Formats {
            records,
            partitions,
            iterations,
        } => formats::formats(config, *records, *partitions, (*iterations).max(1)).await,
        BenchCommand::IngestOnce { event, json } => ingest::ingest_once(config, event, *json).await,
        BenchCommand::State {
            rates,
            partitions,
            hours,
            batch,
            step_minutes,
            join,
        } => {
            if *join {
                for &rate in rates {
                    for &p in partitions {
                        state::join(config, rate.max(1), p.max(1), hours.max(0.02)).await?;
                    }
                }
                return Ok(());
            }
            let mut shapes = Vec::new();
            for &rate in rates {
                for &p in partitions {
                    shapes.push(state::Shape {
                        rate: rate.max(1),
                        partitions: p.max(1),
                        hours: hours.max(0.01),
                        batch: (*batch).max(1),
                        step_minutes: (*step_minutes).max(1),
                    });
                }
            }
            state::state(config, &shapes).await
        }
        BenchCommand::StateLoad { home } => state::state_load(config, home).await,
        BenchCommand::Compact {
            total_mb,
            target_mb,
            reencode,
        } => compact::compact(config, *total_mb, *target_mb, *reencode).await,
        BenchCommand::CompactOnce {
            home,
            target_mb,
            reencode,
            json,
        } => compact::compact_once(home, *target_mb, *reencode, *json).await,
        BenchCommand::Commit { files } => compact::commit(config, *files).await,
        BenchCommand::Scale {
            backlogs,
            records,
            partitions,
            keep,
            upsert_keys,
            changes,
        } => {
            if upsert_keys.is_empty() {
                scale::scale(config, backlogs, *records, *partitions, *keep).await
            } else {
                scale::upsert_scale(upsert_keys, *changes).await
            }
        }
        BenchCommand::ScaleOnce { home } => scale::scale_once(config, home).await,
        BenchCommand::Audit { records } => audit::audit(*records).await,
        BenchCommand::Upsert {
            records,
            keys,
            batch,
            rounds_of,
        } => upsert::upsert(*records, *keys, *batch, *rounds_of).await,
        BenchCommand::Cost {
            partitions,
            batches,
            cycles,
            records,
            processing,
        } => {
            cost::cost(
                config,
                partitions,
                (*batches).max(1),
                (*cycles).max(1),
                *records,
                *processing,
            )
            .await
        }
        BenchCommand::Freshness {
            seconds,
            rate,
            window_ms,
            interval_s,
            moto,
        } => {
            let args = freshness::FreshnessArgs {
                seconds: *seconds,
                rate: *rate,
                window_ms: (*window_ms).max(1),
                interval_s: (*interval_s).max(1),
                moto: *moto,
            };
            freshness::freshness(config, &args).await
        }
        BenchCommand::Reference(args) => reference::run(config, args).await,
        BenchCommand::Kafka {
            bootstrap_servers,
            records,
            partitions,
            batch_size,
            rate,
            seconds,
        } => {
            let args = broker::KafkaBenchArgs {
                bootstrap: bootstrap_servers.clone(),
                records: *records,
                partitions: *partitions,
                batch_size: (*batch_size).clamp(1, 10_000),
                rate: (*rate).max(1),
                seconds: (*seconds).max(1),
            };
            broker::kafka(config, &args).await
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Peak resident set size of this process, in KiB (Linux `VmHWM`).
pub fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// CPU time of this process so far (all threads), in seconds.
pub fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` only writes the `timespec` it is given, which lives on this stack
    // frame; CLOCK_PROCESS_CPUTIME_ID is supported by every Linux kernel.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc == 0 {
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    } else {
        0.0
    }
}

fn tempdir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("streamtable-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
    Ok(dir)
}

/// The pipeline spec without derived tables: the spine's benchmarks measure a topic landing as
/// its own table (as the Python reference does); `bench process` measures derived tables.
pub(crate) fn spine_spec(config: &Config) -> Result<crate::spec::PipelineSpec> {
    let mut spec = config.load_pipeline()?;
    spec.derived.clear();
    Ok(spec)
}
