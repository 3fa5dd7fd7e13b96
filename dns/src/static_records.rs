//! Static records: a YAML (or JSON) file listing names to serve without Kubernetes — for
//! operators running `xcc dns` outside a cluster, and for benchmarks.
//!
//! ```yaml
//! - fqdn: web.xcc.test
//!   addresses: [10.0.0.1, "fd00::1"]
//!   ports: [{name: http, port: 80, protocol: TCP}]
//! ```
//!
//! Each entry becomes a [`ServiceInfo`] keyed `""/<fqdn>`; the empty namespace sorts first, so
//! a static name wins a conflict with a Service.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use thiserror::Error;
use xcc_proto::names::{FqdnError, canonical_fqdn};

use super::zone::{NameAnnotations, NamedPort, ServiceInfo, ServiceKey};

/// One entry of the file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticRecord {
    /// The name to serve.
    pub fqdn: String,
    /// Its addresses (A and AAAA).
    pub addresses: Vec<IpAddr>,
    /// Its ports; named ones get SRV records.
    #[serde(default)]
    pub ports: Vec<NamedPort>,
}

/// Why a static records file was refused. Every variant names the file.
#[derive(Debug, Error)]
pub enum StaticRecordsError {
    /// The file could not be read.
    #[error("cannot read static records {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a list of records.
    #[error("invalid static records {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause, with its location.
        source: yaml_serde::Error,
    },
    /// An entry's name is not a DNS name.
    #[error("invalid static records {path}: entry {index}: {source}")]
    Fqdn {
        /// The file.
        path: PathBuf,
        /// Position of the entry (from 0).
        index: usize,
        /// The cause.
        source: FqdnError,
    },
    /// An entry has no address.
    #[error("invalid static records {path}: entry {index} ({fqdn}) has no addresses")]
    NoAddresses {
        /// The file.
        path: PathBuf,
        /// Position of the entry (from 0).
        index: usize,
        /// Its name.
        fqdn: String,
    },
    /// Two entries name the same FQDN.
    #[error("invalid static records {path}: entries {first} and {index} both name {fqdn}")]
    Duplicate {
        /// The file.
        path: PathBuf,
        /// The earlier entry.
        first: usize,
        /// The later entry.
        index: usize,
        /// The name (canonical).
        fqdn: String,
    },
}

/// Parse the text of a static records file (`path` is for messages).
pub fn parse(text: &str, path: &Path) -> Result<Vec<ServiceInfo>, StaticRecordsError> {
    // JSON is read by serde_json, which streams into the records; yaml_serde (which also reads
    // JSON, and gives the error messages) first holds every event of the document, which at
    // 100,000 entries leaves tens of MB of fragments in the heap.
    let json = text
        .trim_start()
        .starts_with('[')
        .then(|| serde_json::from_str::<Vec<StaticRecord>>(text).ok())
        .flatten();
    let records = match json {
        Some(records) => records,
        None => yaml_serde::from_str(text).map_err(|source| StaticRecordsError::Parse {
            path: path.to_path_buf(),
            source,
        })?,
    };
    let mut out = Vec::with_capacity(records.len());
    for (index, r) in records.into_iter().enumerate() {
        let fqdn = canonical_fqdn(&r.fqdn).map_err(|source| StaticRecordsError::Fqdn {
            path: path.to_path_buf(),
            index,
            source,
        })?;
        if r.addresses.is_empty() {
            return Err(StaticRecordsError::NoAddresses {
                path: path.to_path_buf(),
                index,
                fqdn,
            });
        }
        // The parser's vectors keep spare capacity (room for four addresses); these records
        // stay for the life of the server.
        let (mut cluster_ips, mut ports) = (r.addresses, r.ports);
        cluster_ips.shrink_to_fit();
        ports.shrink_to_fit();
        let fqdn: Arc<str> = fqdn.into();
        out.push(ServiceInfo {
            key: ServiceKey::new("", fqdn.clone()),
            annotations: NameAnnotations {
                fqdn: Some(fqdn),
                ..NameAnnotations::default()
            },
            cluster_ips,
            ports,
        });
    }
    if let Some((first, index)) = first_duplicate(&out) {
        return Err(StaticRecordsError::Duplicate {
            path: path.to_path_buf(),
            first,
            index,
            fqdn: out[index].key.name.to_string(),
        });
    }
    Ok(out)
}

/// The earliest entry (in file order) whose name an earlier entry already has, as (that
/// earlier entry, the entry). Sorts positions instead of collecting names in a map, which would
/// copy every name and leave the copies' holes between the records kept.
fn first_duplicate(records: &[ServiceInfo]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by(|&a, &b| {
        records[a]
            .key
            .name
            .cmp(&records[b].key.name)
            .then(a.cmp(&b))
    });
    order
        .windows(2)
        .filter(|w| records[w[0]].key.name == records[w[1]].key.name)
        .map(|w| (w[0], w[1]))
        .min_by_key(|&(_, later)| later)
}

/// Read and parse a static records file.
pub fn load(path: &Path) -> Result<Vec<ServiceInfo>, StaticRecordsError> {
    let text = std::fs::read_to_string(path).map_err(|source| StaticRecordsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zone::PortProtocol;

    fn p() -> &'static Path {
        Path::new("records.yaml")
    }

    #[test]
    fn yaml_and_json_entries() {
        let yaml = "- fqdn: Web.XCC.test.\n  addresses: [10.0.0.1, \"fd00::1\"]\n  ports:\n  - {name: http, port: 80}\n  - {port: 53, protocol: UDP}\n";
        let out = parse(yaml, p()).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].key, ServiceKey::new("", "web.xcc.test"));
        assert_eq!(out[0].annotations.fqdn.as_deref(), Some("web.xcc.test"));
        assert_eq!(out[0].cluster_ips.len(), 2);
        assert_eq!(out[0].ports[0].protocol, PortProtocol::Tcp);
        assert_eq!(out[0].ports[1].protocol, PortProtocol::Udp);
        let json = r#"[{"fqdn": "a.xcc.test", "addresses": ["10.0.0.2"]}]"#;
        assert_eq!(
            parse(json, p()).unwrap()[0].cluster_ips[0].to_string(),
            "10.0.0.2"
        );
        assert!(parse("[]", p()).unwrap().is_empty());
        // A YAML flow sequence is not JSON: it falls back to the YAML reader.
        let flow = "[{fqdn: b.xcc.test, addresses: [10.0.0.3]}]";
        assert_eq!(
            parse(flow, p()).unwrap()[0].key,
            ServiceKey::new("", "b.xcc.test")
        );
    }

    #[test]
    fn errors_name_the_file_and_entry() {
        let cases = [
            (
                "- fqdn: a.xcc.test\n  addresses: [not-an-ip]\n",
                "invalid static records records.yaml: ",
            ),
            (
                "- fqdn: a.xcc.test\n  addresses: [10.0.0.1]\n  ttl: 5\n",
                "unknown field `ttl`",
            ),
            (
                "- fqdn: a_b.xcc.test\n  addresses: [10.0.0.1]\n",
                "entry 0: invalid FQDN \"a_b.xcc.test\"",
            ),
            (
                "- fqdn: a.xcc.test\n  addresses: []\n",
                "entry 0 (a.xcc.test) has no addresses",
            ),
            (
                "- {fqdn: a.xcc.test, addresses: [10.0.0.1]}\n- {fqdn: A.xcc.test., addresses: [10.0.0.2]}\n",
                "entries 0 and 1 both name a.xcc.test",
            ),
            (
                "- {fqdn: b.xcc.test, addresses: [10.0.0.1]}\n- {fqdn: a.xcc.test, addresses: [10.0.0.1]}\n\
                 - {fqdn: c.xcc.test, addresses: [10.0.0.1]}\n- {fqdn: c.xcc.test, addresses: [10.0.0.1]}\n\
                 - {fqdn: a.xcc.test, addresses: [10.0.0.1]}\n- {fqdn: a.xcc.test, addresses: [10.0.0.1]}\n",
                "entries 2 and 3 both name c.xcc.test",
            ),
        ];
        for (text, expected) in cases {
            let err = parse(text, p()).unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
        let err = load(Path::new("/nonexistent/records.yaml")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read static records /nonexistent/records.yaml")
        );
    }
}
