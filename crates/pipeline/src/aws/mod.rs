//! Shared AWS SDK plumbing: one configuration loaded once, error classification, and X-Ray
//! subsegments for the calls ([`xray`]).

pub mod xray;

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// Loads the standard AWS configuration (region, credentials, `AWS_ENDPOINT_URL`) once.
pub async fn load_config() -> aws_config::SdkConfig {
    aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
}

/// An SDK error, classified.
#[derive(Debug, Clone)]
pub struct SdkFault {
    /// HTTP status, when the service answered.
    pub status: Option<u16>,
    /// The service's error code (`NoSuchKey`, `ConditionalCheckFailedException`, …).
    pub code: Option<String>,
    /// Whether retrying later can succeed (network, 5xx, throttling).
    pub retryable: bool,
    /// Full text with causes.
    pub message: String,
}

impl SdkFault {
    /// Classifies any SDK operation error. The SDK has already retried transient faults.
    pub fn from_sdk<E>(err: &SdkError<E, HttpResponse>) -> SdkFault
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let status = err.raw_response().map(|r| r.status().as_u16());
        let code = match err {
            SdkError::ServiceError(e) => e.err().code().map(str::to_string),
            _ => None,
        };
        let throttled = code.as_deref().is_some_and(|c| {
            matches!(
                c,
                "ThrottlingException"
                    | "Throttling"
                    | "ProvisionedThroughputExceededException"
                    | "RequestLimitExceeded"
                    | "SlowDown"
                    | "RequestTimeout"
                    | "InternalError"
                    | "ServiceUnavailable"
                    | "TransactionInProgressException"
            )
        });
        let retryable = match err {
            SdkError::ConstructionFailure(_) => false,
            SdkError::TimeoutError(_)
            | SdkError::DispatchFailure(_)
            | SdkError::ResponseError(_) => true,
            SdkError::ServiceError(_) => throttled || status.is_some_and(|s| s >= 500 || s == 429),
            _ => true,
        };
        SdkFault {
            status,
            code,
            retryable,
            message: DisplayErrorContext(err).to_string(),
        }
    }

    /// Whether the service said the object or item does not exist.
    pub fn is_not_found(&self) -> bool {
        self.status == Some(404)
            || matches!(
                self.code.as_deref(),
                Some(
                    "NoSuchKey"
                        | "NotFound"
                        | "ResourceNotFoundException"
                        | "EntityNotFoundException"
                )
            )
    }
}
