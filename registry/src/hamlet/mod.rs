//! Hamlet protocol: the server side, the managed client and the payload conversions.

mod batch;
pub mod client;
pub mod consumer;
pub mod convert;
mod import_thread;
pub mod pieces;
pub mod server;
pub mod sweep;
mod wire;
