//! Process-level measures of a Lambda binary: start to its first Runtime API poll, and size.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long one start may take before it counts as a failure.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Milliseconds from spawning `binary` to its first `GET …/runtime/invocation/next` on a
/// Runtime API listener on 127.0.0.1, once per run. `env` configures the function.
pub(super) fn init_ms(binary: &Path, env: &[(&str, String)], runs: usize) -> Result<Vec<f64>> {
    let name = binary.display().to_string();
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("listen on", "127.0.0.1", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("listen on", "127.0.0.1", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("listen on", "127.0.0.1", e))?;
        let started = Instant::now();
        let mut child = Command::new(binary)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", "ingest")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "bench")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io("start", &name, e))?;
        let polled = loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream
                        .set_nonblocking(false)
                        .and_then(|_| stream.set_read_timeout(Some(START_TIMEOUT)))
                        .map_err(|e| Error::io("read from", &name, e))?;
                    let mut line = String::new();
                    BufReader::new(stream)
                        .read_line(&mut line)
                        .map_err(|e| Error::io("read from", &name, e))?;
                    break line
                        .contains("/runtime/invocation/next")
                        .then(|| started.elapsed());
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if started.elapsed() > START_TIMEOUT
                        || child.try_wait().ok().flatten().is_some()
                    {
                        break None;
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
                Err(e) => return Err(Error::io("accept on", "127.0.0.1", e)),
            }
        };
        let _ = child.kill();
        let output = child.wait_with_output();
        match polled {
            Some(d) => out.push(d.as_secs_f64() * 1e3),
            None => {
                let stderr = output
                    .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                    .unwrap_or_default();
                return Err(Error::Internal(format!(
                    "{name} did not poll the Runtime API within {} s: {stderr}",
                    START_TIMEOUT.as_secs()
                )));
            }
        }
    }
    Ok(out)
}

/// The environment of an ingest Lambda on the AWS backend at start (nothing is called before
/// the first invocation, so no endpoint is needed).
pub(super) fn aws_init_env() -> Vec<(&'static str, String)> {
    vec![
        ("STREAMTABLE_BACKEND", "aws".to_string()),
        ("STREAMTABLE_BUCKET", "bench-bucket".to_string()),
        ("STREAMTABLE_STATE_TABLE", "bench-state".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ACCESS_KEY_ID", "bench".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "bench".to_string()),
    ]
}

/// Wall milliseconds of `program args…` run to completion, once per run.
pub(super) fn run_ms(program: &Path, args: &[&str], runs: usize) -> Result<Vec<f64>> {
    let name = program.display().to_string();
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let status = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| Error::io("run", &name, e))?;
        if !status.success() {
            return Err(Error::Internal(format!(
                "{name} {args:?} failed ({status})"
            )));
        }
        out.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(out)
}

/// Size of `binary` and of a stripped copy of it (`strip` from binutils), in bytes; the
/// stripped size is `None` when `strip` is not available.
pub(super) fn sizes(binary: &Path, scratch: &Path) -> Result<(u64, Option<u64>)> {
    let name = binary.display().to_string();
    let size = std::fs::metadata(binary)
        .map_err(|e| Error::io("read", &name, e))?
        .len();
    let copy = scratch.join("stripped");
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(&copy)
        .arg(binary)
        .status()
        .ok()
        .filter(|s| s.success())
        .and_then(|_| std::fs::metadata(&copy).ok())
        .map(|m| m.len());
    let _ = std::fs::remove_file(&copy);
    Ok((size, stripped))
}
