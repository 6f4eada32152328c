//! A real Kafka cluster: `streamtable run` (a local event source mapping that polls a broker and
//! invokes the ingest handler with ESM-shaped batches) and `streamtable produce` (the demo's
//! generator into a topic). The client is librdkafka (the `rdkafka` crate), built from its
//! bundled source; the Lambda functions do not link it.
//!
//! - [`batch`]: how a stream is cut into invocations (`BatchSize`, the batching window, the
//!   6 MB payload), without Kafka;
//! - [`source`]: the poller: assignment from the pipeline's checkpoints, invocations, the
//!   consumer group's offsets, lag, the scheduled stage on its interval;
//! - [`args`]: what a run is asked (the mapping's settings as flags) and what it reports;
//! - [`handler`]: what an invocation calls, and a batch invoked until it lands (retried whole);
//! - [`invoke`]: `--invoke URL`, the events POSTed to a Lambda runtime emulator;
//! - [`produce`]: records into a topic;
//! - [`log`]: a topic's own log, which `streamtable audit --bootstrap-servers` compares.

pub mod args;
pub mod batch;
pub mod handler;
pub mod invoke;
pub mod log;
pub mod produce;
pub mod progress;
pub mod source;
pub mod stop;

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::message::BorrowedMessage;

use crate::error::{Error, Result};
use crate::esm::{EsmHeader, EsmRecord};

/// How to reach a Kafka cluster: the flags every Kafka command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// Brokers to bootstrap from, `host:port[,host:port…]`.
    #[arg(long, env = "STREAMTABLE_BOOTSTRAP_SERVERS")]
    pub bootstrap_servers: String,
    /// `security.protocol`: plaintext, ssl, sasl_plaintext or sasl_ssl.
    #[arg(long, default_value = "plaintext")]
    pub security_protocol: String,
    /// `sasl.mechanism`: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(long)]
    pub sasl_mechanism: Option<String>,
    /// SASL user name (Confluent Cloud: the API key).
    #[arg(long, env = "STREAMTABLE_KAFKA_USERNAME")]
    pub sasl_username: Option<String>,
    /// SASL password (Confluent Cloud: the API secret); better from the environment.
    #[arg(long, env = "STREAMTABLE_KAFKA_PASSWORD", hide_env_values = true)]
    pub sasl_password: Option<String>,
    /// CA certificate (PEM file) the brokers' certificates are checked against.
    #[arg(long)]
    pub ssl_ca_location: Option<String>,
    /// Client certificate (PEM file) for mutual TLS.
    #[arg(long)]
    pub ssl_certificate_location: Option<String>,
    /// Client private key (PEM file) for mutual TLS.
    #[arg(long)]
    pub ssl_key_location: Option<String>,
    /// Any other librdkafka property, `name=value` (repeatable), e.g.
    /// `-X client.dns.lookup=use_all_dns_ips`.
    #[arg(short = 'X', long = "kafka-option", value_name = "NAME=VALUE")]
    pub options: Vec<String>,
}

impl Connection {
    /// A plaintext connection to `bootstrap_servers`.
    pub fn plaintext(bootstrap_servers: &str) -> Connection {
        Connection {
            bootstrap_servers: bootstrap_servers.to_string(),
            security_protocol: "plaintext".into(),
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            ssl_ca_location: None,
            ssl_certificate_location: None,
            ssl_key_location: None,
            options: Vec::new(),
        }
    }

    /// The librdkafka configuration these flags describe.
    pub fn client_config(&self) -> Result<ClientConfig> {
        let mut c = ClientConfig::new();
        if self.bootstrap_servers.trim().is_empty() {
            return Err(Error::Config(
                "--bootstrap-servers is empty: give the brokers as host:port[,host:port]".into(),
            ));
        }
        c.set("bootstrap.servers", self.bootstrap_servers.trim());
        let protocol = self.security_protocol.to_ascii_lowercase();
        if !["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"].contains(&protocol.as_str()) {
            return Err(Error::Config(format!(
                "--security-protocol {:?}: use plaintext, ssl, sasl_plaintext or sasl_ssl",
                self.security_protocol
            )));
        }
        c.set("security.protocol", &protocol);
        if protocol.starts_with("sasl") {
            let mechanism = self.sasl_mechanism.as_deref().unwrap_or("PLAIN");
            c.set("sasl.mechanism", mechanism);
            let (Some(user), Some(password)) = (&self.sasl_username, &self.sasl_password) else {
                return Err(Error::Config(format!(
                    "--security-protocol {protocol} needs --sasl-username and \
                     STREAMTABLE_KAFKA_PASSWORD (or --sasl-password)"
                )));
            };
            c.set("sasl.username", user);
            c.set("sasl.password", password);
        }
        for (name, value) in [
            ("ssl.ca.location", &self.ssl_ca_location),
            ("ssl.certificate.location", &self.ssl_certificate_location),
            ("ssl.key.location", &self.ssl_key_location),
        ] {
            if let Some(v) = value {
                c.set(name, v);
            }
        }
        for o in &self.options {
            let Some((name, value)) = o.split_once('=') else {
                return Err(Error::Config(format!(
                    "-X {o:?}: write a librdkafka property as name=value"
                )));
            };
            c.set(name.trim(), value.trim());
        }
        Ok(c)
    }
}

/// A Kafka client error as the project's error, naming what was being done: a configuration
/// or authorisation problem is not retryable, an unreachable broker or a moving leader is.
pub(crate) fn kafka_error(op: &str, e: rdkafka::error::KafkaError) -> Error {
    use rdkafka::error::RDKafkaErrorCode as Code;
    let code = e.rdkafka_error_code();
    let config = matches!(
        code,
        Some(
            Code::SaslAuthenticationFailed
                | Code::Authentication
                | Code::TopicAuthorizationFailed
                | Code::GroupAuthorizationFailed
                | Code::ClusterAuthorizationFailed
                | Code::InvalidConfig
                | Code::InvalidArgument
                | Code::UnknownTopicOrPartition
        )
    ) || matches!(e, rdkafka::error::KafkaError::ClientConfig(..));
    if config {
        return Error::Config(format!("kafka: {op}: {e}"));
    }
    let retryable = matches!(
        code,
        Some(
            Code::BrokerTransportFailure
                | Code::AllBrokersDown
                | Code::OperationTimedOut
                | Code::RequestTimedOut
                | Code::NotLeaderForPartition
                | Code::LeaderNotAvailable
                | Code::NetworkException
                | Code::CoordinatorLoadInProgress
                | Code::CoordinatorNotAvailable
                | Code::NotCoordinator
                | Code::MessageTimedOut
                | Code::QueueFull
                | Code::NotEnoughReplicas
                | Code::NotEnoughReplicasAfterAppend
                | Code::KafkaStorageError
                | Code::FencedLeaderEpoch
                | Code::UnknownLeaderEpoch
                | Code::ThrottlingQuotaExceeded
        )
    );
    Error::Kafka {
        op: op.to_string(),
        message: e.to_string(),
        retryable,
    }
}

/// A fetched record as the event source mapping delivers it: key and value base64, headers as
/// their keys and bytes, the timestamp and its type.
pub fn esm_record(message: &BorrowedMessage<'_>) -> EsmRecord {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    let (timestamp, timestamp_type) = match message.timestamp() {
        rdkafka::Timestamp::CreateTime(t) => (t, "CREATE_TIME"),
        rdkafka::Timestamp::LogAppendTime(t) => (t, "LOG_APPEND_TIME"),
        rdkafka::Timestamp::NotAvailable => (-1, "NO_TIMESTAMP_TYPE"),
    };
    EsmRecord {
        topic: Some(message.topic().to_string()),
        partition: message.partition() as i64,
        offset: message.offset(),
        timestamp,
        timestamp_type: Some(timestamp_type.to_string()),
        key: message.key().map(|k| STANDARD.encode(k)),
        value: message.payload().map(|v| STANDARD.encode(v)),
        headers: headers(message),
    }
}

/// The record's headers, read through librdkafka's C interface: the `rdkafka` crate's own
/// reader panics on a header key that is not UTF-8, which any producer can send. Such a key is
/// kept with its invalid bytes replaced (U+FFFD); values are kept as they are.
fn headers(message: &BorrowedMessage<'_>) -> Vec<EsmHeader> {
    use rdkafka::bindings as rd;
    let mut out = Vec::new();
    let mut hdrs: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: the message pointer is valid while `message` is borrowed; librdkafka keeps the
    // headers owned by the message and only hands out a pointer to them.
    let err = unsafe { rd::rd_kafka_message_headers(message.ptr(), &mut hdrs) };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || hdrs.is_null() {
        return out;
    }
    // SAFETY: `hdrs` is the message's header list, valid while the message is.
    let count = unsafe { rd::rd_kafka_header_cnt(hdrs) };
    for idx in 0..count {
        let mut name: *const std::os::raw::c_char = std::ptr::null();
        let mut value: *const std::ffi::c_void = std::ptr::null();
        let mut size: usize = 0;
        // SAFETY: `idx` < the header count; the out-pointers point at locals.
        let err =
            unsafe { rd::rd_kafka_header_get_all(hdrs, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: librdkafka's header names are NUL-terminated and live as long as the message.
        let key = unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let value = (!value.is_null()).then(|| {
            // SAFETY: `value` points at `size` bytes owned by the message.
            unsafe { std::slice::from_raw_parts(value as *const u8, size) }.to_vec()
        });
        out.push(EsmHeader { key, value });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_flags_map_to_librdkafka_properties_and_refuse_what_cannot_work() {
        let mut c = Connection::plaintext("127.0.0.1:9092");
        let cfg = c.client_config().expect("plaintext");
        assert_eq!(cfg.get("bootstrap.servers"), Some("127.0.0.1:9092"));
        c.security_protocol = "SASL_SSL".into();
        let err = c.client_config().expect_err("no credentials");
        assert!(err.to_string().contains("--sasl-username"), "{err}");
        c.sasl_username = Some("key".into());
        c.sasl_password = Some("secret".into());
        c.sasl_mechanism = Some("SCRAM-SHA-512".into());
        c.options = vec!["client.id = me".into()];
        let cfg = c.client_config().expect("sasl");
        assert_eq!(cfg.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(cfg.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(cfg.get("client.id"), Some("me"));
        c.options = vec!["nonsense".into()];
        assert!(c.client_config().is_err());
        c.security_protocol = "tls".into();
        assert!(c.client_config().is_err());
    }
}
