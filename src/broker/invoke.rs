//! `streamtable run --invoke URL`: each event POSTed to a Lambda Invoke endpoint, such as the
//! one `cargo lambda watch` serves (`http://127.0.0.1:9000/2015-03-31/functions/ingest/invocations`),
//! so that the real bootstrap binary is what runs. An invocation failed when the answer is not
//! 2xx, carries `X-Amz-Function-Error` (as Lambda's Invoke API marks a function error), or is a
//! JSON error object (`errorType`/`errorMessage`).
//!
//! Plain HTTP/1.1 on a loopback or local address: the emulators speak nothing else.

use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::source::Handler;
use crate::error::{Error, Result};
use crate::esm::EsmEvent;
use crate::ingest::IngestSummary;

/// The longest answer read (a summary is a few hundred bytes).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// A Lambda Invoke endpoint.
#[derive(Debug, Clone)]
pub struct HttpInvoke {
    host: String,
    port: u16,
    path: String,
    timeout: Duration,
}

impl HttpInvoke {
    /// Parses `http://host[:port]/path`.
    pub fn new(url: &str, timeout: Duration) -> Result<HttpInvoke> {
        let refuse = |why: &str| {
            Error::Config(format!(
                "--invoke {url:?}: {why}; give http://HOST:PORT/2015-03-31/functions/NAME/invocations"
            ))
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| refuse("only http:// is supported"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| refuse("bad port"))?),
            None => (authority, 80),
        };
        if host.is_empty() {
            return Err(refuse("no host"));
        }
        Ok(HttpInvoke {
            host: host.to_string(),
            port,
            path: path.to_string(),
            timeout,
        })
    }

    async fn post(&self, body: &[u8]) -> Result<(u16, String, Vec<u8>)> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Error::Internal(format!(
                "invoke http://{}:{}{}: {what}: {e}",
                self.host, self.port, self.path
            ))
        };
        let mut stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| fail("connect", &e))?;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.path,
            self.host,
            self.port,
            body.len()
        );
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| fail("send", &e))?;
        stream.write_all(body).await.map_err(|e| fail("send", &e))?;
        let mut answer = Vec::new();
        (&mut stream)
            .take(MAX_ANSWER_BYTES as u64)
            .read_to_end(&mut answer)
            .await
            .map_err(|e| fail("read the answer", &e))?;
        let split = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| fail("read the answer", &"no HTTP header"))?;
        let head = String::from_utf8_lossy(&answer[..split]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| fail("read the answer", &"no HTTP status"))?;
        let mut body = answer[split + 4..].to_vec();
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            body = dechunk(&body);
        }
        Ok((status, head, body))
    }
}

/// The body of a chunked answer (what can be read of it).
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&raw[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok());
        let Some(size) = size.filter(|s| *s > 0) else {
            break;
        };
        let start = eol + 2;
        let end = (start + size).min(raw.len());
        out.extend_from_slice(&raw[start..end]);
        raw = raw.get(end + 2..).unwrap_or(&[]);
    }
    out
}

#[async_trait]
impl Handler for HttpInvoke {
    async fn handle(&self, event: &EsmEvent) -> Result<IngestSummary> {
        let body = serde_json::to_vec(event).map_err(|e| Error::Internal(e.to_string()))?;
        let (status, head, answer) = tokio::time::timeout(self.timeout, self.post(&body))
            .await
            .map_err(|_| {
                Error::Internal(format!(
                    "invoke: no answer within {} s",
                    self.timeout.as_secs()
                ))
            })??;
        let text = String::from_utf8_lossy(&answer);
        let json: Option<serde_json::Value> = serde_json::from_slice(&answer).ok();
        let function_error = head.to_ascii_lowercase().contains("x-amz-function-error")
            || json
                .as_ref()
                .is_some_and(|v| v.get("errorType").is_some() || v.get("errorMessage").is_some());
        if !(200..300).contains(&status) || function_error {
            let excerpt: String = text.chars().take(500).collect();
            return Err(Error::Internal(format!(
                "the function failed (HTTP {status}): {excerpt}"
            )));
        }
        let get = |k: &str| {
            json.as_ref()
                .and_then(|v| v.get(k))
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0)
        };
        Ok(IngestSummary {
            records: event.len() as u64,
            accepted: get("accepted"),
            already_seen: get("already_seen"),
            dead_lettered: get("dead_lettered"),
            files_written: get("files_written"),
            ..IngestSummary::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_refuse_what_cannot_be_reached() {
        let h = HttpInvoke::new(
            "http://127.0.0.1:9000/2015-03-31/functions/ingest/invocations",
            Duration::from_secs(1),
        )
        .expect("parses");
        assert_eq!((h.host.as_str(), h.port), ("127.0.0.1", 9000));
        assert_eq!(h.path, "/2015-03-31/functions/ingest/invocations");
        assert!(HttpInvoke::new("https://x/y", Duration::from_secs(1)).is_err());
        assert!(HttpInvoke::new("http://:9/y", Duration::from_secs(1)).is_err());
        assert!(HttpInvoke::new("http://h:99999/y", Duration::from_secs(1)).is_err());
    }

    #[test]
    fn a_chunked_body_is_joined() {
        assert_eq!(dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), b"abcde");
        assert_eq!(dechunk(b"zz\r\n"), b"");
    }
}
