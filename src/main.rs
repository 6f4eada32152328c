//! `streamtable`: the command line. Each command calls the same library code the Lambda
//! functions run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use streamtable::Error;
use streamtable::cli::{self, analyst, demo};
use streamtable::config::Config;

#[derive(Parser)]
#[command(
    name = "streamtable",
    version,
    about = "Kafka topics to Apache Iceberg tables, exactly once"
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
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the ingest handler (the one the Lambda runs) on MSK ESM event files.
    Ingest {
        /// ESM event JSON file(s), as `cargo lambda invoke --data-file` takes them.
        #[arg(long = "event", required = true)]
        events: Vec<PathBuf>,
    },
    /// Commit pending files as Iceberg snapshots, compact small files, expire old snapshots and
    /// remove orphans, once (what the scheduled Lambda runs on every tick).
    #[command(alias = "compact")]
    Scheduled(cli::ScheduledArgs),
    /// Feed batches the event source mapping gave up on (its S3 on-failure destination's
    /// records, or event files) back through ingest, exactly once.
    Replay(cli::ReplayArgs),
    /// Move a partition whose topic was deleted and created again to the new log: its
    /// checkpoint (and window and dedup state) to the new log's start, its ledger of delivered
    /// offsets set aside; what ingest says to run when it refuses such a partition
    ResetPartition(cli::ResetPartitionArgs),
    /// Validate the pipeline spec and print, per table, its source, its SQL, its inferred
    /// schema and how it runs, then what it changes in the catalog's existing tables (+ added,
    /// ~ widened, renamed or relaxed, - dropped, ! refused), and what the stateful tables do
    /// with the state live in the partitions. Exit code 1 when the spec is invalid, a change
    /// would be refused or a stateful table would lose its open state; use it in CI before
    /// `sam deploy`.
    Check {
        /// Accept a changed stateful table whose stored state the new SQL cannot read (another
        /// window or GROUP BY, another dedup key): its open windows or keys are dropped when
        /// the new SQL first runs.
        #[arg(long)]
        allow_state_reset: bool,
    },
    /// A local event source mapping: poll a Kafka cluster's topics (the spec's) and land them
    /// through the ingest handler in ESM-shaped batches, starting from the pipeline's
    /// checkpoints; run the scheduled stage on its interval. Stops on Ctrl-C / SIGTERM after
    /// the batch in flight, or with --until-idle once caught up.
    Run(streamtable::broker::source::RunArgs),
    /// Produce the demo's records (bad ones included) into a Kafka topic.
    Produce(streamtable::broker::produce::ProduceArgs),
    /// Write a synthetic MSK ESM event file.
    Generate(cli::GenerateArgs),
    /// The whole pipeline on the embedded default: generate events for every example table,
    /// ingest them (with bad records and re-deliveries, as the real ESM sends them), commit and
    /// compact them into Iceberg tables, and answer the dashboard questions with SQL.
    Demo(demo::DemoArgs),
    /// Run a read-only SQL query over the tables (DataFusion; the same SQL runs in Athena).
    Query(analyst::QueryArgs),
    /// List the tables: rows, data files, last snapshot, freshness.
    Tables {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// What an operator looks at when something is wrong: per topic-partition its checkpoint,
    /// last landing and pending batches; per table its last commit and compaction; the last
    /// scheduled run's failures, blocked batches and backlog.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check that every offset the pipeline took from each topic-partition is in the topic's
    /// table or in dead_letters exactly once (below its checkpoint, but pending batches);
    /// exit code 1 naming the offsets missing or found twice.
    Audit(cli::audit::AuditArgs),
    /// Register tables whose files are in the warehouse but whose catalog entry is gone (a Glue
    /// database deleted with an old stack): each points at its newest metadata file, or the
    /// command refuses and lists the candidates when a failed commit left two.
    Register(cli::RegisterArgs),
    /// Render the dashboards (infra/dashboards/*.sql) as one self-contained HTML file.
    Dashboard(analyst::DashboardArgs),
}

fn config(args: &Args) -> Result<Config, Error> {
    cli::config_from_flags(
        args.pipeline.as_deref(),
        args.home.as_deref(),
        args.backend.as_deref(),
    )
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    streamtable::telemetry::init_cli_logs();
    let args = Args::parse();
    let result = async {
        let config = config(&args)?;
        // Which spec the command runs with, where it reads one.
        if !matches!(
            &args.command,
            Command::Produce(_) | Command::Generate(_) | Command::Query(_) | Command::Dashboard(_)
        ) {
            eprintln!("{}", cli::spec_line(&config));
        }
        match &args.command {
            Command::Ingest { events } => cli::ingest(&config, events).await,
            Command::Scheduled(c) => cli::scheduled(&config, c).await,
            Command::Replay(r) => cli::replay(&config, r).await,
            Command::ResetPartition(r) => cli::reset_partition(&config, r).await,
            Command::Check { allow_state_reset } => {
                cli::check::run(&config, *allow_state_reset).await
            }
            Command::Run(r) => cli::run(&config, r).await,
            Command::Produce(p) => streamtable::broker::produce::run(p, &config).await,
            Command::Generate(g) => cli::generate(g),
            Command::Demo(d) => demo::run(&config, d).await,
            Command::Query(q) => analyst::query(&config, q).await,
            Command::Tables { json } => analyst::tables(&config, *json).await,
            Command::Status { json } => cli::status::run(&config, *json).await,
            Command::Register(r) => cli::register(&config, r).await,
            Command::Audit(a) => cli::audit::run(&config, a).await,
            Command::Dashboard(d) => analyst::dashboard(&config, d).await,
        }
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            if e.is_retryable() {
                eprintln!("this fault is transient: retrying the same command can succeed");
                ExitCode::from(cli::EXIT_RETRYABLE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
