//! A Confluent-compatible schema registry over HTTP(S): `GET /schemas/ids/{id}` and
//! `GET /subjects/{subject}/versions/latest`.

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use super::{Latest, Lookup, SchemaId, SchemaSource, fault};
use crate::error::{Error, Result};

/// How long one request may take before the batch is retried.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest registry answer read, bytes: a schema beyond it is an unknown schema naming the
/// limit, never a read without end.
pub const MAX_RESPONSE_BYTES: usize = 2 * 1024 * 1024;

/// What a `GET` found.
enum Got<T> {
    Found(T),
    /// 404.
    NotFound,
    /// The answer is larger than [`MAX_RESPONSE_BYTES`].
    TooLarge,
}

/// A Confluent-compatible registry (Confluent Platform or Cloud, Redpanda, Apicurio's
/// compatibility API, Karapace).
#[derive(Debug, Clone)]
pub struct ConfluentRegistry {
    client: reqwest::Client,
    url: String,
    auth: Option<(String, String)>,
}

#[derive(Deserialize)]
struct LatestResponse {
    id: u32,
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
}

#[derive(Deserialize)]
struct SchemaResponse {
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
}

impl ConfluentRegistry {
    /// A client of the registry at `url`, with basic auth `key:secret` when given.
    pub fn new(url: &str, auth: Option<&str>) -> Result<ConfluentRegistry> {
        let url = url.trim_end_matches('/').to_string();
        if url.starts_with("https://") {
            install_tls_provider()?;
        } else if url.starts_with("http://") {
            // The client builds its TLS configuration even for plain HTTP.
            let _ = install_tls_provider();
        } else {
            return Err(Error::Config(format!(
                "registry url {url:?} must start with https:// or http://"
            )));
        }
        let authority = url.split_once("://").map_or("", |(_, rest)| {
            rest.split(['/', '?', '#']).next().unwrap_or_default()
        });
        if authority.contains('@') {
            return Err(Error::Config(format!(
                "registry url must not carry credentials (URLs appear in logs and errors); set {} to key:secret instead",
                super::AUTH_ENV
            )));
        }
        let auth = match auth.filter(|a| !a.is_empty()) {
            None => None,
            Some(_) if url.starts_with("http://") && !is_loopback(authority) => {
                return Err(Error::Config(format!(
                    "registry url {url:?} is plain http: the registry's key and secret would cross the network in the clear; use https:// (plain http is allowed with credentials only on localhost)"
                )));
            }
            Some(a) => {
                let (key, secret) = a.split_once(':').ok_or_else(|| {
                    Error::Config(format!(
                        "{} must be key:secret (the registry's API key and secret)",
                        super::AUTH_ENV
                    ))
                })?;
                Some((key.to_string(), secret.to_string()))
            }
        };
        // No redirects: a registry's API does not need them, and following one could carry the
        // credentials to another scheme or host.
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Config(format!("registry client for {url}: {e}")))?;
        Ok(ConfluentRegistry { client, url, auth })
    }
}

impl ConfluentRegistry {
    /// `GET {url}/{path}`: the body, `None` on 404, a fault otherwise (retryable unless the
    /// registry answered with a client error other than 401, 403 or 429).
    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<Got<T>> {
        let url = format!("{}/{path}", self.url);
        let mut request = self
            .client
            .get(&url)
            .header("Accept", "application/vnd.schemaregistry.v1+json");
        if let Some((key, secret)) = &self.auth {
            request = request.basic_auth(key, Some(secret));
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| fault(&self.url, format!("GET {url}: {e}"), true))?;
        let status = response.status();
        if status.as_u16() == 404 {
            return Ok(Got::NotFound);
        }
        if status.is_redirection() {
            return Err(fault(
                &self.url,
                format!(
                    "GET {url}: {status}: the registry redirects; set the registry url to where it redirects to"
                ),
                false,
            ));
        }
        if status.as_u16() == 401 || status.as_u16() == 403 {
            return Err(fault(
                &self.url,
                format!(
                    "GET {url}: {status}: the registry refused the credentials; set {} to the registry's key:secret",
                    super::AUTH_ENV
                ),
                true,
            ));
        }
        if !status.is_success() {
            let retryable = status.is_server_error() || status.as_u16() == 429;
            return Err(fault(&self.url, format!("GET {url}: {status}"), retryable));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| fault(&self.url, format!("GET {url}: {e}"), true))?
        {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Ok(Got::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map(Got::Found).map_err(|e| {
            fault(
                &self.url,
                format!("GET {url}: not a registry response: {e}"),
                true,
            )
        })
    }
}

/// Whether a URL's authority (`host[:port]`) is this machine.
fn is_loopback(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(feature = "aws")]
fn install_tls_provider() -> Result<()> {
    // The AWS SDK's TLS stack (rustls with aws-lc) serves the registry too; installing it twice
    // is harmless.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    Ok(())
}

#[cfg(not(feature = "aws"))]
fn install_tls_provider() -> Result<()> {
    Err(Error::Config(
        "an https:// registry needs the build's TLS stack (the aws feature)".into(),
    ))
}

#[async_trait]
impl SchemaSource for ConfluentRegistry {
    async fn fetch(&self, id: &SchemaId) -> Result<Lookup> {
        let SchemaId::Confluent(n) = id else {
            return Ok(Lookup::Missing(format!(
                "{id} cannot be looked up in the Confluent registry at {}",
                self.url
            )));
        };
        let body: SchemaResponse = match self.get(&format!("schemas/ids/{n}")).await? {
            Got::Found(body) => body,
            Got::NotFound => {
                return Ok(Lookup::Missing(format!(
                    "{id} is not in the registry at {} (404)",
                    self.url
                )));
            }
            Got::TooLarge => {
                return Ok(Lookup::Missing(format!(
                    "{id}: the registry's answer is over {MAX_RESPONSE_BYTES} bytes (the limit)"
                )));
            }
        };
        Ok(Lookup::Found {
            schema: body.schema,
            // The registry leaves `schemaType` out for Avro.
            kind: body.schema_type.unwrap_or_else(|| "AVRO".into()),
        })
    }

    async fn latest(&self, subject: &str) -> Result<Latest> {
        let encoded: String = subject
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let path = format!("subjects/{encoded}/versions/latest");
        let body: LatestResponse = match self.get(&path).await? {
            Got::Found(body) => body,
            Got::NotFound => {
                return Ok(Latest::Missing(format!(
                    "subject {subject:?} is not in the registry at {} (404)",
                    self.url
                )));
            }
            Got::TooLarge => {
                return Err(fault(
                    &self.url,
                    format!(
                        "subject {subject:?}: the registry's answer is over {MAX_RESPONSE_BYTES} bytes (the limit)"
                    ),
                    false,
                ));
            }
        };
        Ok(Latest::Found {
            id: SchemaId::Confluent(body.id),
            schema: body.schema,
            kind: body.schema_type.unwrap_or_else(|| "AVRO".into()),
        })
    }

    fn describe(&self) -> String {
        format!("Confluent-compatible registry at {}", self.url)
    }
}
