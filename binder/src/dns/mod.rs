//! `xcc dns`: an authoritative DNS server for the names of imported services.
//!
//! Data flows one way: a feed (Kubernetes watches, a static records file, a test) applies
//! Services, pods and namespaces to the [`index::DnsIndex`], which publishes immutable
//! [`answer::Snapshot`]s on a `watch`; the pure [`answer::answer`] function answers each
//! question from the current snapshot. [`zone`] is the record model built from Services;
//! [`pods`] maps source addresses to pod namespaces for transparent resolution and namespace
//! mapping.

pub mod answer;
pub mod index;
pub mod pods;
pub mod zone;
