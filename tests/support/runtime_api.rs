//! A minimal AWS Lambda Runtime API on 127.0.0.1, enough to drive a Lambda binary the way the
//! Lambda service does: it hands out events on `/next` and records what the function posts back.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the function answered to one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Response(String),
    Error(String),
    InitError(String),
}

#[derive(Default)]
struct State {
    events: Vec<String>,
    next: usize,
    outcomes: Vec<Outcome>,
}

/// The emulated Runtime API.
pub struct RuntimeApi {
    pub address: String,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl RuntimeApi {
    /// Starts serving `events` (JSON payloads), in order.
    pub fn start(events: Vec<String>) -> RuntimeApi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind runtime API");
        let address = listener.local_addr().expect("address").to_string();
        let state = Arc::new((
            Mutex::new(State {
                events,
                ..Default::default()
            }),
            Condvar::new(),
        ));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                std::thread::spawn(move || serve(stream, shared));
            }
        });
        RuntimeApi { address, state }
    }

    /// Waits until `n` outcomes were posted (or the timeout passes) and returns them.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Outcome> {
        let (lock, cvar) = &*self.state;
        let deadline = Instant::now() + timeout;
        let mut state = lock.lock().expect("state");
        while state.outcomes.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = cvar.wait_timeout(state, left).expect("wait").0;
        }
        state.outcomes.clone()
    }
}

fn serve(stream: TcpStream, shared: Arc<(Mutex<State>, Condvar)>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let body = String::from_utf8_lossy(&body).to_string();
        let mut parts = request_line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let (lock, cvar) = &*shared;
        let reply = if method == "GET" && path.ends_with("/runtime/invocation/next") {
            let event = {
                let mut state = lock.lock().expect("state");
                let i = state.next;
                state.next += 1;
                state.events.get(i).cloned().map(|e| (i, e))
            };
            match event {
                Some((i, e)) => {
                    let deadline = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis())
                        + 300_000;
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nLambda-Runtime-Aws-Request-Id: request-{i}\r\n\
                         Lambda-Runtime-Deadline-Ms: {deadline}\r\n\
                         Lambda-Runtime-Invoked-Function-Arn: arn:aws:lambda:us-east-1:123456789012:function:test\r\n\
                         Lambda-Runtime-Trace-Id: Root=1-00000000-000000000000000000000000;Sampled=0\r\n\
                         Content-Length: {}\r\n\r\n{e}",
                        e.len()
                    )
                }
                // No more events: keep the function waiting, as Lambda does between invocations.
                None => {
                    std::thread::sleep(Duration::from_secs(3600));
                    return;
                }
            }
        } else {
            let outcome = if path.contains("/init/error") {
                Outcome::InitError(body)
            } else if path.ends_with("/error") {
                Outcome::Error(body)
            } else {
                Outcome::Response(body)
            };
            lock.lock().expect("state").outcomes.push(outcome);
            cvar.notify_all();
            "HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{\"status\":\"OK\"}\n".to_string()
        };
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// Runs a Lambda binary against `api` with the standard Lambda environment plus `env`, until
/// `n` outcomes arrived; returns them and the function's standard output.
pub fn run_lambda(
    binary: &str,
    api: &RuntimeApi,
    env: &[(&str, &str)],
    n: usize,
) -> (Vec<Outcome>, String) {
    let mut cmd = std::process::Command::new(binary);
    cmd.env("AWS_LAMBDA_RUNTIME_API", &api.address)
        .env("AWS_LAMBDA_FUNCTION_NAME", "test")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "test")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "test")
        .env_remove("STREAMTABLE_BACKEND")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start the Lambda binary");
    let outcomes = api.wait_for(n, Duration::from_secs(120));
    let _ = child.kill();
    let out = child.wait_with_output().expect("output");
    (outcomes, String::from_utf8_lossy(&out.stdout).to_string())
}
