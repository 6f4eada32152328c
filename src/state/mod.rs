//! The [`StateStore`](crate::checkpoint::StateStore) implementations: DynamoDB on AWS, SQLite on
//! the embedded backend.

pub mod dynamodb;
pub mod sqlite;

pub use dynamodb::DynamoStateStore;
pub use sqlite::SqliteStateStore;
