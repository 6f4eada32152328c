//! `streamtable`: the command line. Each command calls the same library code the Lambda
//! functions run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use streamtable::config::Config;
use streamtable::{Error, bench, cli};

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
    /// remove orphans (what the scheduled compaction Lambda runs).
    Compact(cli::CompactArgs),
    /// Write a synthetic MSK ESM event file.
    Generate(cli::GenerateArgs),
    /// Generate events for every example table, ingest them (with bad records and
    /// re-deliveries, as the real ESM sends them), commit them as Iceberg snapshots and print
    /// what landed.
    Demo(cli::DemoArgs),
    /// Benchmarks that print numbers.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
}

fn config(args: &Args) -> Result<Config, Error> {
    let pipeline = args.pipeline.as_ref().map(|p| p.display().to_string());
    let home = args.home.as_ref().map(|p| p.display().to_string());
    Config::from_lookup(|k| match k {
        "STREAMTABLE_PIPELINE" if pipeline.is_some() => pipeline.clone(),
        "STREAMTABLE_HOME" if home.is_some() => home.clone(),
        "STREAMTABLE_BACKEND" if args.backend.is_some() => args.backend.clone(),
        _ => std::env::var(k).ok().filter(|v| !v.is_empty()),
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    streamtable::telemetry::init_cli_logs();
    let args = Args::parse();
    let result = async {
        let config = config(&args)?;
        match &args.command {
            Command::Ingest { events } => cli::ingest(&config, events).await,
            Command::Compact(c) => cli::compact(&config, c).await,
            Command::Generate(g) => cli::generate(g),
            Command::Demo(d) => cli::demo(&config, d).await,
            Command::Bench { which } => bench::run(&config, which).await,
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
