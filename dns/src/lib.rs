//! `xcc dns`: an authoritative DNS server for the names of imported services.
//!
//! Data flows one way: a feed ([`kube_feed`]'s watches, a file-mode registry's imports through
//! [`imports_feed`], a [`static_records`] file, a test) applies
//! Services, pods and namespaces to the [`index::DnsIndex`], which publishes immutable
//! [`answer::Snapshot`]s on a `watch`; the [`server`] decodes each query ([`wire`]), asks the
//! pure [`answer::answer`] function (common questions take the byte-level [`fast`] path), and
//! sends the response or relays the query upstream.
//! [`zone`] is the record model built from Services; [`pods`] maps source addresses to pod
//! namespaces for transparent resolution and namespace mapping.
//!
//! The crate serves names only: it reads Services (or a records file) and never writes Kubernetes
//! objects, so it does not depend on the binder, which does.

// Tests state their expectations with unwrap; the lint guards input handling in library code.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod answer;
pub mod fast;
pub mod headless;
pub mod imports_feed;
pub mod index;
pub mod kube_feed;
pub mod metrics;
pub mod pods;
pub mod server;
pub mod static_records;
pub mod udp;
pub mod wire;
pub mod zone;
