//! The named ports of a service as they travel from an exporter to an importer: the check that
//! turns ports from the wire (a hierarchy answer's `ports`) or from a stored record into the
//! `spec.ports` of an imported ServiceRecord and the ports of the Service and ServiceImport the
//! binder writes. Both the registry (when it imports) and the binder (when it materialises) use
//! [`checked`], so what one keeps the other accepts, and whatever the API server would refuse —
//! costing the whole record or Service — is dropped port by port instead, each with its reason.

use std::collections::BTreeSet;

use thiserror::Error;

use crate::crd::{Protocol, ServicePort};
use crate::names::is_port_name;

/// Most ports one imported service keeps: an EndpointSlice holds at most 100.
pub const MAX_PORTS: usize = 100;

/// One port as a peer or a record gave it, unchecked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawPort<'a> {
    /// Port name; empty for none.
    pub name: &'a str,
    /// Port clients connect to.
    pub port: u32,
    /// `TCP`, `UDP` or `SCTP`; empty for TCP.
    pub protocol: &'a str,
    /// Port on the endpoints that serves it; 0 for the same as `port`.
    pub target_port: u32,
}

impl<'a> RawPort<'a> {
    /// The raw form of a record's port.
    pub fn of(p: &'a ServicePort) -> Self {
        Self {
            name: p.name.as_deref().unwrap_or_default(),
            port: u32::try_from(p.port).unwrap_or(0),
            protocol: p.protocol().as_str(),
            // Unset is 0; a set one that is no port (0, negative) stays one, to be dropped.
            target_port: p.target_port.map_or(0, |t| {
                u32::try_from(t)
                    .ok()
                    .filter(|t| *t != 0)
                    .unwrap_or(u32::MAX)
            }),
        }
    }
}

/// Why a port was dropped.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Dropped {
    /// The port is not in 1-65535.
    #[error("port {0} is out of range 1-65535")]
    Port(u32),
    /// The target port is not in 1-65535.
    #[error("port {port}: target port {target} is out of range 1-65535")]
    TargetPort {
        /// The port.
        port: u32,
        /// Its target port.
        target: u32,
    },
    /// The protocol is none of `TCP`, `UDP`, `SCTP`.
    #[error("port {port}: protocol {protocol:?} is none of TCP, UDP, SCTP")]
    Protocol {
        /// The port.
        port: u32,
        /// The protocol, at most 64 bytes of it.
        protocol: String,
    },
    /// The name is not a port name ([`is_port_name`]).
    #[error(
        "port {port}: name {name:?} is not a port name (a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit)"
    )]
    Name {
        /// The port.
        port: u32,
        /// The name, at most 64 bytes of it.
        name: String,
    },
    /// An earlier port has the same name.
    #[error("port {port}: name {name:?} is taken by an earlier port")]
    DuplicateName {
        /// The port.
        port: u32,
        /// The name.
        name: String,
    },
    /// An earlier port has the same number and protocol.
    #[error("port {port}/{}: listed before", .protocol.as_str())]
    DuplicatePort {
        /// The port.
        port: u32,
        /// Its protocol.
        protocol: Protocol,
    },
    /// More than [`MAX_PORTS`] ports.
    #[error("port {0}: more than {MAX_PORTS} ports")]
    TooMany(u32),
    /// Unnamed while other ports are kept: a Service with several ports names each.
    #[error("port {0}: unnamed, and a service with several ports needs a name for each")]
    Unnamed(u32),
}

/// At most 64 bytes of hostile text, for a message.
fn shown(s: &str) -> String {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The ports of `raw` a ServiceRecord, a Service and a ServiceImport all accept, in order, and
/// each dropped one (by its index in `raw`) with why: a port and a target port (0: the port)
/// in 1-65535, the protocol `TCP` (or empty), `UDP` or `SCTP`, a name that is empty or a DNS-1123
/// label ([`is_port_name`]), no name and no port/protocol pair twice (the first one
/// stays), with several ports kept a name on each (an unnamed one among several is dropped),
/// and then the first [`MAX_PORTS`]. A target port equal to the port is left unset.
pub fn checked<'a>(raw: impl IntoIterator<Item = RawPort<'a>>) -> Checked {
    let mut kept: Vec<(usize, ServicePort)> = Vec::new();
    let mut dropped = Vec::new();
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    for (i, p) in raw.into_iter().enumerate() {
        let why = (|| {
            let port = i32::try_from(p.port)
                .ok()
                .filter(|n| (1..=65535).contains(n))
                .ok_or(Dropped::Port(p.port))?;
            let target = match p.target_port {
                0 => None,
                t => Some(
                    i32::try_from(t)
                        .ok()
                        .filter(|n| (1..=65535).contains(n))
                        .ok_or(Dropped::TargetPort {
                            port: p.port,
                            target: t,
                        })?,
                ),
            };
            let protocol = match p.protocol {
                "" => Protocol::Tcp,
                other => Protocol::parse(other).ok_or_else(|| Dropped::Protocol {
                    port: p.port,
                    protocol: shown(other),
                })?,
            };
            if !p.name.is_empty() && !is_port_name(p.name) {
                return Err(Dropped::Name {
                    port: p.port,
                    name: shown(p.name),
                });
            }
            if !p.name.is_empty() && names.contains(p.name) {
                return Err(Dropped::DuplicateName {
                    port: p.port,
                    name: p.name.to_string(),
                });
            }
            if !numbers.insert((port, protocol)) {
                return Err(Dropped::DuplicatePort {
                    port: p.port,
                    protocol,
                });
            }
            if !p.name.is_empty() {
                names.insert(p.name);
            }
            Ok(ServicePort {
                name: (!p.name.is_empty()).then(|| p.name.to_string()),
                port,
                protocol: Some(protocol),
                target_port: target.filter(|t| *t != port),
            })
        })();
        match why {
            Ok(port) => kept.push((i, port)),
            Err(e) => dropped.push((i, e)),
        }
    }
    if kept.len() > 1 {
        kept.retain(|(i, p)| {
            let named = p.name.is_some();
            if !named {
                dropped.push((*i, Dropped::Unnamed(u32::try_from(p.port).unwrap_or(0))));
            }
            named
        });
    }
    if kept.len() > MAX_PORTS {
        for (i, p) in kept.drain(MAX_PORTS..) {
            dropped.push((i, Dropped::TooMany(u32::try_from(p.port).unwrap_or(0))));
        }
    }
    dropped.sort_by_key(|(i, _)| *i);
    (kept.into_iter().map(|(_, p)| p).collect(), dropped)
}

/// Hamlet label carrying a service's named ports, which the Hamlet wire format has no field
/// for: the exporting registry adds it to every `FederatedService` whose entry has ports
/// ([`format_label`]), and an xcc importer turns it back into the import's ports
/// ([`parse_label`]) instead of keeping it as an annotation. The value is the JSON list of the
/// record's `spec.ports` (`name`, `port`, `protocol`, `targetPort`). Plain Hamlet peers see one
/// more label (XCC v1 keeps it as an annotation of its imported record and reads nothing of it).
pub const PORTS_LABEL: &str = "connectivity.tanzu.vmware.com/ports";

/// Longest [`PORTS_LABEL`] value read: [`MAX_PORTS`] ports of the longest form fit well inside.
pub const MAX_PORTS_LABEL_LEN: usize = 16 * 1024;

/// What [`checked`] keeps, and what it drops (by index) with why.
pub type Checked = (Vec<ServicePort>, Vec<(usize, Dropped)>);

/// Why a [`PORTS_LABEL`] value gives no ports at all.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum LabelError {
    /// Longer than [`MAX_PORTS_LABEL_LEN`].
    #[error("{PORTS_LABEL} is {0} bytes, more than {MAX_PORTS_LABEL_LEN}")]
    TooLong(usize),
    /// Not a JSON list.
    #[error("{PORTS_LABEL} is not a JSON list of ports: {0}")]
    NotAList(String),
}

/// The [`PORTS_LABEL`] value of `ports` (those [`checked`] keeps).
pub fn format_label(ports: &[ServicePort]) -> String {
    serde_json::to_string(ports).unwrap_or_default()
}

/// The ports a [`PORTS_LABEL`] value gives, [`checked`] (the dropped ones with their reasons).
/// Hostile input costs its entry: an item that is not an object of the expected field types is
/// dropped as a port 0, never the other ports; only a value that is too long or not a JSON list
/// gives none.
pub fn parse_label(value: &str) -> Result<Checked, LabelError> {
    if value.len() > MAX_PORTS_LABEL_LEN {
        return Err(LabelError::TooLong(value.len()));
    }
    let items: Vec<serde_json::Value> =
        serde_json::from_str(value).map_err(|e| LabelError::NotAList(e.to_string()))?;
    let number = |item: &serde_json::Value, key: &str| match item.get(key) {
        None => Some(0),
        Some(v) => v.as_u64().and_then(|n| u32::try_from(n).ok()),
    };
    let text = |item: &'_ serde_json::Value, key: &str| -> Option<String> {
        match item.get(key) {
            None => Some(String::new()),
            Some(v) => v.as_str().map(str::to_string),
        }
    };
    // (name, port, protocol, target) of each item; a field of the wrong type makes it port 0.
    let parsed: Vec<(String, u32, String, u32)> = items
        .iter()
        .map(|item| {
            match (
                text(item, "name"),
                number(item, "port"),
                text(item, "protocol"),
                // A target that is no port stays one, to be dropped.
                number(item, "targetPort").map(|t| {
                    if item.get("targetPort").is_some() && t == 0 {
                        u32::MAX
                    } else {
                        t
                    }
                }),
            ) {
                (Some(name), Some(port), Some(protocol), Some(target)) if item.is_object() => {
                    (name, port, protocol, target)
                }
                _ => (String::new(), 0, String::new(), 0),
            }
        })
        .collect();
    Ok(checked(parsed.iter().map(
        |(name, port, protocol, target)| RawPort {
            name,
            port: *port,
            protocol,
            target_port: *target,
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(name: &'static str, port: u32, protocol: &'static str, target: u32) -> RawPort<'static> {
        RawPort {
            name,
            port,
            protocol,
            target_port: target,
        }
    }

    fn sp(name: Option<&str>, port: i32, protocol: Protocol, target: Option<i32>) -> ServicePort {
        ServicePort {
            name: name.map(Into::into),
            port,
            protocol: Some(protocol),
            target_port: target,
        }
    }

    #[test]
    fn good_ports_are_kept_in_order_with_their_names_protocols_and_targets() {
        let (kept, dropped) = checked([
            raw("sql", 5432, "TCP", 15432),
            raw("stats", 9187, "UDP", 0),
            raw("sig", 7000, "SCTP", 7000),
            raw("web", 80, "", 0),
        ]);
        assert_eq!(
            kept,
            [
                sp(Some("sql"), 5432, Protocol::Tcp, Some(15432)),
                sp(Some("stats"), 9187, Protocol::Udp, None),
                // A target equal to the port is the port: left unset.
                sp(Some("sig"), 7000, Protocol::Sctp, None),
                sp(Some("web"), 80, Protocol::Tcp, None),
            ]
        );
        assert_eq!(dropped, []);
        // One port needs no name.
        assert_eq!(
            checked([raw("", 443, "", 8443)]),
            (vec![sp(None, 443, Protocol::Tcp, Some(8443))], vec![])
        );
        assert_eq!(checked([]), (vec![], vec![]));
    }

    #[test]
    fn service_port_names_are_kept_as_kubernetes_allows_them() {
        // A Service's port names are DNS-1123 labels: longer than an IANA service name,
        // digits only, or with a double '-'.
        let max: &'static str = Box::leak("p".repeat(63).into_boxed_str());
        let (kept, dropped) = checked([
            raw("grpc-metrics-endpoint", 9090, "TCP", 0),
            raw("123", 9091, "TCP", 0),
            raw("a--b", 9092, "TCP", 0),
            raw(max, 9093, "TCP", 0),
        ]);
        assert_eq!(dropped, []);
        assert_eq!(
            kept,
            [
                sp(Some("grpc-metrics-endpoint"), 9090, Protocol::Tcp, None),
                sp(Some("123"), 9091, Protocol::Tcp, None),
                sp(Some("a--b"), 9092, Protocol::Tcp, None),
                sp(Some(max), 9093, Protocol::Tcp, None),
            ]
        );
    }

    #[test]
    fn each_bad_port_is_dropped_with_its_reason_and_costs_only_itself() {
        let long = "x".repeat(10_000);
        let long: &'static str = Box::leak(long.into_boxed_str());
        let (kept, dropped) = checked([
            raw("zero", 0, "TCP", 0),
            raw("big", 70_000, "TCP", 0),
            raw("far", 80, "TCP", 65_536),
            raw("lower", 81, "tcp", 0),
            raw("quic", 82, "QUIC", 0),
            raw("Upper", 83, "TCP", 0),
            raw("-lead", 84, "TCP", 0),
            raw("trail-", 85, "TCP", 0),
            raw("under_score", 86, "TCP", 0),
            raw(long, 87, "TCP", 0),
            raw("web", 443, "TCP", 0),
            raw("web", 444, "TCP", 0),
            raw("alt", 443, "TCP", 0),
            raw("dns", 443, "UDP", 0),
        ]);
        assert_eq!(
            kept,
            [
                sp(Some("web"), 443, Protocol::Tcp, None),
                sp(Some("dns"), 443, Protocol::Udp, None),
            ]
        );
        let reasons: Vec<(usize, String)> =
            dropped.iter().map(|(i, d)| (*i, d.to_string())).collect();
        assert_eq!(
            reasons[..9],
            [
                (0, "port 0 is out of range 1-65535".to_string()),
                (1, "port 70000 is out of range 1-65535".into()),
                (2, "port 80: target port 65536 is out of range 1-65535".into()),
                (3, "port 81: protocol \"tcp\" is none of TCP, UDP, SCTP".into()),
                (4, "port 82: protocol \"QUIC\" is none of TCP, UDP, SCTP".into()),
                (5, "port 83: name \"Upper\" is not a port name (a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit)".into()),
                (6, "port 84: name \"-lead\" is not a port name (a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit)".into()),
                (7, "port 85: name \"trail-\" is not a port name (a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit)".into()),
                (8, "port 86: name \"under_score\" is not a port name (a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit)".into()),
            ]
        );
        assert_eq!(
            dropped[9],
            (
                9,
                Dropped::Name {
                    port: 87,
                    name: "x".repeat(64)
                }
            ),
            "hostile text is shown bounded"
        );
        assert_eq!(
            reasons[10..],
            [
                (
                    11,
                    "port 444: name \"web\" is taken by an earlier port".to_string()
                ),
                (12, "port 443/TCP: listed before".into()),
            ]
        );
    }

    #[test]
    fn several_ports_need_names_and_the_count_is_bounded() {
        let (kept, dropped) = checked([raw("", 80, "TCP", 0), raw("https", 443, "TCP", 0)]);
        assert_eq!(kept, [sp(Some("https"), 443, Protocol::Tcp, None)]);
        assert_eq!(dropped, [(0, Dropped::Unnamed(80))]);
        // All unnamed: none kept (the importer falls back to its single port).
        let (kept, dropped) = checked([raw("", 80, "TCP", 0), raw("", 443, "TCP", 0)]);
        assert_eq!(kept, []);
        assert_eq!(
            dropped,
            [(0, Dropped::Unnamed(80)), (1, Dropped::Unnamed(443))]
        );
        // An unnamed port left alone once the others are dropped is kept.
        let (kept, _) = checked([raw("", 80, "TCP", 0), raw("BAD", 443, "TCP", 0)]);
        assert_eq!(kept, [sp(None, 80, Protocol::Tcp, None)]);

        let names: Vec<String> = (0..150).map(|i| format!("p{i}")).collect();
        let (kept, dropped) = checked(names.iter().enumerate().map(|(i, n)| RawPort {
            name: n,
            port: 1000 + i as u32,
            protocol: "TCP",
            target_port: 0,
        }));
        assert_eq!(kept.len(), MAX_PORTS);
        assert_eq!(kept.last().unwrap().port, 1099);
        assert_eq!(dropped.len(), 50);
        assert_eq!(dropped[0], (100, Dropped::TooMany(1100)));
    }

    #[test]
    fn the_ports_label_round_trips_and_hostile_values_cost_their_entry() {
        let ports = [
            sp(Some("sql"), 5432, Protocol::Tcp, Some(15432)),
            sp(Some("stats"), 9187, Protocol::Udp, None),
        ];
        let label = format_label(&ports);
        assert_eq!(
            label,
            r#"[{"name":"sql","port":5432,"protocol":"TCP","targetPort":15432},{"name":"stats","port":9187,"protocol":"UDP"}]"#
        );
        assert_eq!(parse_label(&label), Ok((ports.to_vec(), vec![])));
        assert_eq!(parse_label("[]"), Ok((vec![], vec![])));
        // One port without protocol or name: TCP, unnamed.
        assert_eq!(
            parse_label(r#"[{"port": 80}]"#),
            Ok((vec![sp(None, 80, Protocol::Tcp, None)], vec![]))
        );
        // Items of the wrong shape are dropped one by one; the good one stays.
        let (kept, dropped) = parse_label(
            r#"[{"name":"sql","port":5432}, 7, {"name":1,"port":1}, {"port":"80"},
                {"port":-1}, {"port":4294967296}, {"name":"x","port":81,"targetPort":0},
                {"name":"y","port":82,"protocol":"tcp"}]"#,
        )
        .unwrap();
        assert_eq!(kept, [sp(Some("sql"), 5432, Protocol::Tcp, None)]);
        assert_eq!(
            dropped.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6, 7]
        );
        assert!(matches!(dropped[5].1, Dropped::TargetPort { port: 81, .. }));
        // A value that is no list, or too long, gives none.
        assert!(matches!(parse_label("{}"), Err(LabelError::NotAList(_))));
        assert!(matches!(parse_label("80"), Err(LabelError::NotAList(_))));
        let long = format!("[{}]", vec![r#"{"port":1}"#; 2000].join(","));
        assert_eq!(parse_label(&long), Err(LabelError::TooLong(long.len())));
        // The longest labels of MAX_PORTS ports still fit.
        let most: Vec<ServicePort> = (0..MAX_PORTS as i32)
            .map(|i| {
                sp(
                    Some(&format!("port-name-{i:05}")),
                    60_000 + i,
                    Protocol::Sctp,
                    Some(1 + i),
                )
            })
            .collect();
        let label = format_label(&most);
        assert!(label.len() <= MAX_PORTS_LABEL_LEN, "{}", label.len());
        assert_eq!(parse_label(&label), Ok((most, vec![])));
    }

    #[test]
    fn every_bad_port_of_a_label_is_dropped_with_its_own_reason() {
        // The same list as the `v1alpha1_service_bad_ports` fuzz seed (fuzz/make_seeds.py).
        let (kept, dropped) = parse_label(
            r#"[{"name":"a","port":1},{"name":"a","port":2},{"name":"b","port":0},
                {"name":"c","port":"80"},{"name":"d","port":3,"protocol":"ICMP"},
                {"name":"e","port":4,"targetPort":0},{"name":"-x","port":5},{"port":6},7,null]"#,
        )
        .unwrap();
        assert_eq!(kept, [sp(Some("a"), 1, Protocol::Tcp, None)]);
        let name = |s: &str| s.to_string();
        assert_eq!(
            dropped,
            [
                (
                    1,
                    Dropped::DuplicateName {
                        port: 2,
                        name: name("a")
                    }
                ),
                (2, Dropped::Port(0)),
                (3, Dropped::Port(0)),
                (
                    4,
                    Dropped::Protocol {
                        port: 3,
                        protocol: name("ICMP")
                    }
                ),
                (
                    5,
                    Dropped::TargetPort {
                        port: 4,
                        target: u32::MAX
                    }
                ),
                (
                    6,
                    Dropped::Name {
                        port: 5,
                        name: name("-x")
                    }
                ),
                (7, Dropped::Unnamed(6)),
                (8, Dropped::Port(0)),
                (9, Dropped::Port(0)),
            ]
        );
    }

    #[test]
    fn a_records_ports_round_trip() {
        let ports = [
            sp(Some("sql"), 5432, Protocol::Tcp, Some(15432)),
            sp(Some("stats"), 9187, Protocol::Udp, None),
        ];
        let (kept, dropped) = checked(ports.iter().map(RawPort::of));
        assert_eq!((kept.as_slice(), dropped.as_slice()), (&ports[..], &[][..]));
        // A record's target port that is no port is dropped, not taken for unset.
        for bad in [0, -1] {
            let p = sp(Some("sql"), 5432, Protocol::Tcp, Some(bad));
            let (kept, dropped) = checked([RawPort::of(&p)]);
            assert_eq!(kept, []);
            assert!(matches!(
                dropped[..],
                [(0, Dropped::TargetPort { port: 5432, .. })]
            ));
        }
    }
}
