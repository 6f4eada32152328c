//! X-Ray subsegments for the AWS calls a traced invocation makes (S3, DynamoDB, Glue), as the
//! X-Ray SDKs of other languages record them: one SDK interceptor shared by every client sends,
//! after each call, a subsegment (service, operation, HTTP status, fault or error) to the X-Ray
//! daemon Lambda runs beside a function with active tracing (`AWS_XRAY_DAEMON_ADDRESS`), under
//! the invocation's trace and segment (`_X_AMZN_TRACE_ID`, which the Lambda runtime sets per
//! invocation). Unsampled invocations send nothing; a datagram that cannot be sent is dropped
//! (tracing never fails a call).

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeSerializationInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};
use serde_json::json;

/// Where the invocation's trace header comes from (the environment, in Lambda).
type TraceHeader = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The interceptor: add it to each SDK client's config.
#[derive(Clone)]
pub struct XRaySubsegments {
    socket: Arc<UdpSocket>,
    daemon: SocketAddr,
    trace: TraceHeader,
}

impl std::fmt::Debug for XRaySubsegments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XRaySubsegments")
            .field("daemon", &self.daemon)
            .finish()
    }
}

impl XRaySubsegments {
    /// The interceptor of a traced Lambda function: `None` without `AWS_XRAY_DAEMON_ADDRESS`
    /// (not in Lambda, or tracing not active).
    pub fn from_env() -> Option<XRaySubsegments> {
        let address = std::env::var("AWS_XRAY_DAEMON_ADDRESS").ok()?;
        // `host:port`, or `tcp:host:port udp:host:port`.
        let udp = address
            .split_whitespace()
            .find_map(|a| a.strip_prefix("udp:"))
            .unwrap_or(address.as_str())
            .to_string();
        let daemon = std::net::ToSocketAddrs::to_socket_addrs(&udp)
            .ok()?
            .next()?;
        XRaySubsegments::new(daemon, Arc::new(|| std::env::var("_X_AMZN_TRACE_ID").ok()))
    }

    /// An interceptor sending to `daemon`, under the trace header `trace` gives.
    pub fn new(daemon: SocketAddr, trace: TraceHeader) -> Option<XRaySubsegments> {
        let bind: SocketAddr = if daemon.is_ipv6() {
            "[::]:0".parse().ok()?
        } else {
            "0.0.0.0:0".parse().ok()?
        };
        let socket = UdpSocket::bind(bind).ok()?;
        socket.set_nonblocking(true).ok()?;
        Some(XRaySubsegments {
            socket: Arc::new(socket),
            daemon,
            trace,
        })
    }
}

/// When a call started, seconds since the epoch.
#[derive(Debug, Clone, Copy)]
struct StartedAt(f64);

impl Storable for StartedAt {
    type Storer = StoreReplace<Self>;
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The `Root`, `Parent` and `Sampled` fields of a trace header.
fn parse_header(header: &str) -> (Option<&str>, Option<&str>, bool) {
    let (mut root, mut parent, mut sampled) = (None, None, false);
    for part in header.split(';') {
        match part.trim().split_once('=') {
            Some(("Root", v)) => root = Some(v),
            Some(("Parent", v)) => parent = Some(v),
            Some(("Sampled", v)) => sampled = v == "1",
            _ => {}
        }
    }
    (root, parent, sampled)
}

impl Intercept for XRaySubsegments {
    fn name(&self) -> &'static str {
        "XRaySubsegments"
    }

    fn read_before_execution(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state().store_put(StartedAt(now_s()));
        Ok(())
    }

    fn read_after_execution(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(header) = (self.trace)() else {
            return Ok(());
        };
        let (Some(root), Some(parent), true) = parse_header(&header) else {
            return Ok(());
        };
        let end = now_s();
        let start = cfg.load::<StartedAt>().map_or(end, |s| s.0);
        let (service, operation) = cfg
            .load::<Metadata>()
            .map_or(("AWS".to_string(), "unknown".to_string()), |m| {
                (m.service().to_string(), m.name().to_string())
            });
        let status = context.response().map(|r| r.status().as_u16());
        let failed = context.output_or_error().is_some_and(|r| r.is_err());
        let mut doc = json!({
            "name": service,
            "id": format!("{:016x}", rand_id()),
            "trace_id": root,
            "parent_id": parent,
            "start_time": start,
            "end_time": end,
            "type": "subsegment",
            "namespace": "aws",
            "aws": {"operation": operation},
        });
        if let Some(s) = status {
            doc["http"] = json!({"response": {"status": s}});
        }
        match status {
            Some(429) => doc["throttle"] = json!(true),
            Some(s) if s >= 500 => doc["fault"] = json!(true),
            Some(s) if s >= 400 => doc["error"] = json!(true),
            None if failed => doc["fault"] = json!(true),
            _ => {}
        }
        let datagram = format!("{{\"format\":\"json\",\"version\":1}}\n{doc}");
        let _ = self.socket.send_to(datagram.as_bytes(), self.daemon);
        Ok(())
    }
}

/// A random 64-bit id (a subsegment's `id`).
fn rand_id() -> u64 {
    let uuid = uuid::Uuid::new_v4();
    let b = uuid.as_bytes();
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_headers_are_read_field_by_field() {
        assert_eq!(
            parse_header(
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
            ),
            (
                Some("1-5759e988-bd862e3fe1be46a994272793"),
                Some("53995c3f42cd8ad8"),
                true
            )
        );
        assert_eq!(
            parse_header("Root=1-a;Sampled=0"),
            (Some("1-a"), None, false)
        );
    }

    /// A sampled invocation's failed DynamoDB call reaches the daemon as a subsegment of the
    /// invocation's segment, naming the service and operation, marked as a fault; an unsampled
    /// one sends nothing.
    #[tokio::test]
    async fn each_sampled_call_sends_one_subsegment_to_the_daemon() {
        let daemon = UdpSocket::bind("127.0.0.1:0").expect("daemon");
        daemon
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .expect("timeout");
        let address = daemon.local_addr().expect("address");
        let header = Arc::new(std::sync::Mutex::new(
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
                .to_string(),
        ));
        let h = header.clone();
        let xray =
            XRaySubsegments::new(address, Arc::new(move || h.lock().ok().map(|s| s.clone())))
                .expect("interceptor");
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                "testing", "testing", None, None, "test",
            ))
            .endpoint_url("http://127.0.0.1:9")
            .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled())
            .interceptor(xray)
            .build();
        let client = aws_sdk_dynamodb::Client::from_conf(config);
        let _ = client
            .list_tables()
            .send()
            .await
            .expect_err("nothing listens");
        let mut buf = [0u8; 4096];
        let n = daemon.recv(&mut buf).expect("a datagram");
        let text = std::str::from_utf8(&buf[..n]).expect("utf-8");
        let (head, body) = text.split_once('\n').expect("header line");
        assert_eq!(head, r#"{"format":"json","version":1}"#);
        let doc: serde_json::Value = serde_json::from_str(body).expect("segment JSON");
        assert_eq!(doc["type"], "subsegment");
        assert_eq!(doc["trace_id"], "1-5759e988-bd862e3fe1be46a994272793");
        assert_eq!(doc["parent_id"], "53995c3f42cd8ad8");
        assert_eq!(doc["namespace"], "aws");
        assert_eq!(doc["aws"]["operation"], "ListTables");
        assert!(
            doc["name"]
                .as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case("dynamodb")),
            "{doc}"
        );
        assert_eq!(doc["fault"], true);
        assert!(doc["end_time"].as_f64() >= doc["start_time"].as_f64());

        if let Ok(mut s) = header.lock() {
            *s = "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=0".into();
        }
        let _ = client
            .list_tables()
            .send()
            .await
            .expect_err("nothing listens");
        daemon
            .set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .expect("timeout");
        assert!(
            daemon.recv(&mut buf).is_err(),
            "an unsampled call sends nothing"
        );
    }
}
