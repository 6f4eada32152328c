//! Log lines as Lambda users expect them (the conventions of Powertools for AWS Lambda): one
//! JSON object per line with flat keys — `timestamp`, `level`, `message`, `service`,
//! `cold_start`, `function_name`, `function_memory_size`, `function_request_id`,
//! `xray_trace_id` — then the event's own fields. The request and trace ids come from the span
//! the Lambda runtime opens around each invocation.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Invocations this process has started (see [`invocation_started`]).
static INVOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Marks the start of an invocation; returns whether it is the process's first (a cold start).
pub fn invocation_started() -> bool {
    INVOCATIONS.fetch_add(1, Ordering::Relaxed) == 0
}

/// The Lambda log line format.
pub struct LambdaJson {
    service: String,
    function_name: Option<String>,
    memory_mb: Option<u64>,
    invocations: &'static AtomicU64,
}

impl LambdaJson {
    /// The format for this process: `service` from `POWERTOOLS_SERVICE_NAME`, else the
    /// function's name, else `fallback`.
    pub fn from_env(fallback: &str) -> LambdaJson {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let function_name = var("AWS_LAMBDA_FUNCTION_NAME");
        LambdaJson {
            service: var("POWERTOOLS_SERVICE_NAME")
                .or_else(|| function_name.clone())
                .unwrap_or_else(|| fallback.to_string()),
            function_name,
            memory_mb: var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE").and_then(|m| m.parse().ok()),
            invocations: &INVOCATIONS,
        }
    }

    #[cfg(test)]
    fn for_test(invocations: &'static AtomicU64) -> LambdaJson {
        LambdaJson {
            service: "ingest".into(),
            function_name: Some("stack-IngestFunction".into()),
            memory_mb: Some(1024),
            invocations,
        }
    }
}

impl<S> FormatEvent<S, JsonFields> for LambdaJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Map::new();
        event.record(&mut Collect(&mut fields));
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            Value::from(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        );
        line.insert(
            "level".into(),
            Value::from(event.metadata().level().as_str()),
        );
        line.insert(
            "message".into(),
            fields.remove("message").unwrap_or(Value::from("")),
        );
        line.insert("service".into(), Value::from(self.service.as_str()));
        line.insert(
            "cold_start".into(),
            Value::from(self.invocations.load(Ordering::Relaxed) <= 1),
        );
        if let Some(name) = &self.function_name {
            line.insert("function_name".into(), Value::from(name.as_str()));
        }
        if let Some(mb) = self.memory_mb {
            line.insert("function_memory_size".into(), Value::from(mb));
        }
        // The runtime's invocation span carries `requestId` and `xrayTraceId`.
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                let Some(recorded) = ext.get::<FormattedFields<JsonFields>>() else {
                    continue;
                };
                let Ok(Value::Object(span_fields)) =
                    serde_json::from_str::<Value>(recorded.fields.as_str())
                else {
                    continue;
                };
                for (from, to) in [
                    ("requestId", "function_request_id"),
                    ("xrayTraceId", "xray_trace_id"),
                ] {
                    if let Some(v) = span_fields.get(from) {
                        line.insert(to.into(), v.clone());
                    }
                }
            }
        }
        for (k, v) in fields {
            line.entry(k).or_insert(v);
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields as JSON values.
struct Collect<'a>(&'a mut Map<String, Value>);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::from(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
}

/// The level filter: `RUST_LOG` when set, else Lambda's application log level
/// (`AWS_LAMBDA_LOG_LEVEL`, set by the function's `LoggingConfig`), else `POWERTOOLS_LOG_LEVEL`,
/// else `info`.
pub fn filter(var: impl Fn(&str) -> Option<String>) -> tracing_subscriber::EnvFilter {
    if let Some(directives) = var("RUST_LOG").filter(|v| !v.is_empty())
        && let Ok(f) = tracing_subscriber::EnvFilter::try_new(directives)
    {
        return f;
    }
    let level = var("AWS_LAMBDA_LOG_LEVEL")
        .or_else(|| var("POWERTOOLS_LOG_LEVEL"))
        .map(|l| match l.to_ascii_lowercase().as_str() {
            "fatal" | "critical" => "error".to_string(),
            "warning" => "warn".to_string(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| "info".into());
    tracing_subscriber::EnvFilter::try_new(&level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("lock"))?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// One invocation: the runtime's span around what the handler logs.
    fn invoke(request: &str, trace: &str, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        let span = tracing::info_span!(
            "Lambda runtime invoke",
            requestId = request,
            xrayTraceId = trace
        );
        let _entered = span.enter();
        tracing::info!(table = "orders", files = 2_u64, "batch landed");
        tracing::debug!("not shown at info");
    }

    #[test]
    fn cold_and_warm_invocations_log_flat_json_with_their_ids() {
        let counter: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(JsonFields::new())
            .event_format(LambdaJson::for_test(counter))
            .with_env_filter(filter(|k| {
                (k == "AWS_LAMBDA_LOG_LEVEL").then(|| "INFO".into())
            }))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!("init");
            invoke("req-1", "Root=1-abc", counter);
            invoke("req-2", "Root=1-def", counter);
        });
        let text = String::from_utf8(buffer.0.lock().expect("lock").clone()).expect("utf-8");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["level"], "WARN");
        assert_eq!(lines[0]["cold_start"], true);
        assert!(lines[0].get("function_request_id").is_none());
        let (cold, warm) = (&lines[1], &lines[2]);
        for (line, request, trace, is_cold) in [
            (cold, "req-1", "Root=1-abc", true),
            (warm, "req-2", "Root=1-def", false),
        ] {
            assert_eq!(line["message"], "batch landed");
            assert_eq!(line["level"], "INFO");
            assert_eq!(line["service"], "ingest");
            assert_eq!(line["function_name"], "stack-IngestFunction");
            assert_eq!(line["function_memory_size"], 1024);
            assert_eq!(line["cold_start"], is_cold);
            assert_eq!(line["function_request_id"], request);
            assert_eq!(line["xray_trace_id"], trace);
            assert_eq!(line["table"], "orders");
            assert_eq!(line["files"], 2);
            assert!(
                chrono::DateTime::parse_from_rfc3339(line["timestamp"].as_str().expect("ts"))
                    .is_ok()
            );
        }
    }

    #[test]
    fn lambdas_log_level_applies_unless_rust_log_is_set() {
        let f = |vars: &'static [(&'static str, &'static str)]| {
            filter(move |k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            })
            .to_string()
        };
        assert_eq!(f(&[]), "info");
        assert_eq!(f(&[("AWS_LAMBDA_LOG_LEVEL", "DEBUG")]), "debug");
        assert_eq!(f(&[("AWS_LAMBDA_LOG_LEVEL", "FATAL")]), "error");
        assert_eq!(
            f(&[("AWS_LAMBDA_LOG_LEVEL", "DEBUG"), ("RUST_LOG", "warn")]),
            "warn"
        );
    }
}
