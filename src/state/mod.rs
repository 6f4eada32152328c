//! The [`StateStore`](crate::checkpoint::StateStore) implementations: DynamoDB on AWS, SQLite on
//! the embedded backend.

#[cfg(feature = "aws")]
pub mod dynamodb;
pub mod sqlite;

#[cfg(feature = "aws")]
pub use dynamodb::DynamoStateStore;
pub use sqlite::SqliteStateStore;
