//! Server-side defaulting and allocation for built-in kinds, applied to every create and update
//! before validation: Service (type, ports, traffic policies, ClusterIP from 10.96.0.0/12 or
//! fd00:10:96::/112, NodePorts from 30000-32767, values kept across updates), Endpoints and
//! EndpointSlice port protocols, Namespace phase/finalizer/name label. The [`Allocator`] is derived from stored Services and updated on commit.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rand::Rng as _;
use serde_json::{Map, Value, json};

use crate::resources::{Builtin, Resource};
use crate::status::{ApiError, FieldError};

/// Service ClusterIP range (IPv4): kubeadm's default `--service-cluster-ip-range`.
const SERVICE_V4_BASE: u32 = u32::from_be_bytes([10, 96, 0, 0]);
const SERVICE_V4_PREFIX: u32 = 12;
/// Service ClusterIP range (IPv6): kind's default IPv6 service subnet.
const SERVICE_V6_BASE: u128 = 0xfd00_0010_0096_0000_0000_0000_0000_0000;
const SERVICE_V6_PREFIX: u32 = 112;
/// Default `--service-node-port-range`.
const NODE_PORTS: std::ops::RangeInclusive<i64> = 30000..=32767;

/// The address of the `kubernetes` Service: the first address of the range.
pub(crate) const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

fn obj_mut<'a>(v: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !v.get(key).is_some_and(Value::is_object) {
        v[key] = json!({});
    }
    match v.get_mut(key) {
        Some(Value::Object(m)) => m,
        // Unreachable: the key was just set to an object.
        _ => unreachable!("{key} was just set to an object"),
    }
}

fn set_default(m: &mut Map<String, Value>, key: &str, value: Value) {
    if m.get(key)
        .is_none_or(|v| v.is_null() || v.as_str() == Some(""))
    {
        m.insert(key.to_string(), value);
    }
}

/// Applies defaults to `obj` (an update when `old` is set). Fails only on undecodable input.
pub(crate) fn apply(res: &Resource, obj: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
    match res.builtin {
        Some(Builtin::Service) => service(obj, old),
        Some(Builtin::Endpoints) => {
            if let Some(subsets) = obj.get_mut("subsets").and_then(Value::as_array_mut) {
                for ss in subsets {
                    if let Some(ports) = ss.get_mut("ports").and_then(Value::as_array_mut) {
                        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                            set_default(p, "protocol", "TCP".into());
                        }
                    }
                }
            }
        }
        Some(Builtin::EndpointSlice) => {
            if let Some(ports) = obj.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                    if p.get("name").is_none_or(Value::is_null) {
                        p.insert("name".into(), "".into());
                    }
                    if p.get("protocol").is_none_or(Value::is_null) {
                        p.insert("protocol".into(), "TCP".into());
                    }
                }
            }
        }
        Some(Builtin::Namespace) => {
            let name = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let meta = obj_mut(obj, "metadata");
            obj_mut_self(meta.entry("labels").or_insert(json!({})))
                .insert("kubernetes.io/metadata.name".into(), name.into());
            if old.is_none() {
                set_default(obj_mut(obj, "spec"), "finalizers", json!(["kubernetes"]));
                set_default(obj_mut(obj, "status"), "phase", "Active".into());
            }
        }
        _ => {}
    }
    Ok(())
}

/// Makes `v` an object (replacing anything else) and returns its map.
fn obj_mut_self(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = json!({});
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("value was just set to an object"),
    }
}

fn service(obj: &mut Value, old: Option<&Value>) {
    if old.is_none() {
        // ServiceStatus is a struct in Go: a new Service serialises `status: {loadBalancer: {}}`.
        obj["status"] = json!({"loadBalancer": {}});
    }
    let spec = obj_mut(obj, "spec");
    set_default(spec, "type", "ClusterIP".into());
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if let Some(old) = old {
        patch_allocated_values(spec, &ty, old);
    }
    set_default(spec, "sessionAffinity", "None".into());
    if spec.get("sessionAffinity").and_then(Value::as_str) == Some("ClientIP") {
        let cfg = obj_mut_self(spec.entry("sessionAffinityConfig").or_insert(json!({})));
        let ip = obj_mut_self(cfg.entry("clientIP").or_insert(json!({})));
        // Real default: three hours.
        set_default(ip, "timeoutSeconds", 10800.into());
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            set_default(p, "protocol", "TCP".into());
            let port = p.get("port").cloned().unwrap_or(Value::Null);
            if p.get("targetPort")
                .is_none_or(|t| t.is_null() || t.as_i64() == Some(0) || t.as_str() == Some(""))
            {
                p.insert("targetPort".into(), port);
            }
        }
    }
    if ty != "ExternalName" {
        set_default(spec, "internalTrafficPolicy", "Cluster".into());
    }
    if ty == "NodePort" || ty == "LoadBalancer" {
        set_default(spec, "externalTrafficPolicy", "Cluster".into());
    }
    if ty == "LoadBalancer" {
        set_default(spec, "allocateLoadBalancerNodePorts", true.into());
    }
    if let Some(old) = old
        && old.pointer("/spec/type").and_then(Value::as_str) == Some("LoadBalancer")
        && ty != "LoadBalancer"
        && let Some(lb) = obj.pointer_mut("/status/loadBalancer")
    {
        // Leaving LoadBalancer clears the load-balancer status.
        *lb = json!({});
    }
}

fn needs_cluster_ip(ty: &str) -> bool {
    ty != "ExternalName"
}
fn needs_node_ports(ty: &str) -> bool {
    ty == "NodePort" || ty == "LoadBalancer"
}

fn port_key(p: &Value) -> (i64, String) {
    (
        p.get("port").and_then(Value::as_i64).unwrap_or_default(),
        p.get("protocol")
            .and_then(Value::as_str)
            .unwrap_or("TCP")
            .to_string(),
    )
}

/// The service REST layer's `patchAllocatedValues` / `dropTypeDependentFields`: omitted
/// allocated values are kept across updates, and values that stop applying after a type
/// change are dropped when the client left them unchanged.
fn patch_allocated_values(spec: &mut Map<String, Value>, ty: &str, old: &Value) {
    let old_ty = old
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    if needs_cluster_ip(old_ty) && needs_cluster_ip(ty) {
        for f in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            if let Some(v) = old.pointer(&format!("/spec/{f}")) {
                set_default(spec, f, v.clone());
                if spec
                    .get(f)
                    .and_then(Value::as_array)
                    .is_some_and(Vec::is_empty)
                {
                    spec.insert(f.into(), v.clone());
                }
            }
        }
    } else if needs_cluster_ip(old_ty) && !needs_cluster_ip(ty) {
        for f in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            if spec.get(f) == old.pointer(&format!("/spec/{f}")) {
                spec.remove(f);
            }
        }
    }
    let old_ports = old
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let keep_node_ports = needs_node_ports(old_ty) && needs_node_ports(ty);
    let drop_node_ports = needs_node_ports(old_ty) && !needs_node_ports(ty);
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut() {
            let key = port_key(p);
            let old_np = old_ports
                .iter()
                .find(|o| port_key(o) == key)
                .and_then(|o| o.get("nodePort"))
                .cloned();
            let Some(pm) = p.as_object_mut() else {
                continue;
            };
            if keep_node_ports && let Some(np) = old_np {
                set_default(pm, "nodePort", np);
            } else if drop_node_ports && pm.get("nodePort") == old_np.as_ref() {
                pm.remove("nodePort");
            }
        }
    }
    // Leaving an externally accessible type drops what only applies to it, if unchanged.
    let mut drop_unchanged = |f: &str| {
        if spec.get(f).is_some() && spec.get(f) == old.pointer(&format!("/spec/{f}")) {
            spec.remove(f);
        }
    };
    if needs_node_ports(old_ty) && !needs_node_ports(ty) {
        drop_unchanged("externalTrafficPolicy");
    }
    if old_ty == "LoadBalancer" && ty != "LoadBalancer" {
        for f in [
            "allocateLoadBalancerNodePorts",
            "healthCheckNodePort",
            "loadBalancerClass",
        ] {
            drop_unchanged(f);
        }
    }
    if ty == "LoadBalancer"
        && old_ty == "LoadBalancer"
        && let Some(h) = old.pointer("/spec/healthCheckNodePort")
    {
        set_default(spec, "healthCheckNodePort", h.clone());
    }
}

/// ClusterIP and NodePort bookkeeping over all stored Services.
#[derive(Debug, Default)]
pub(crate) struct Allocator {
    ips: HashSet<IpAddr>,
    node_ports: HashSet<(i64, String)>,
}

fn in_service_range(ip: IpAddr) -> Result<(), &'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let n = u32::from(v4);
            let mask = !0u32 << (32 - SERVICE_V4_PREFIX);
            if n & mask != SERVICE_V4_BASE || n == SERVICE_V4_BASE || n == SERVICE_V4_BASE | !mask {
                return Err("10.96.0.0/12");
            }
        }
        IpAddr::V6(v6) => {
            let n = u128::from(v6);
            let mask = !0u128 << (128 - SERVICE_V6_PREFIX);
            if n & mask != SERVICE_V6_BASE || n == SERVICE_V6_BASE {
                return Err("fd00:10:96::/112");
            }
        }
    }
    Ok(())
}

fn service_ips(svc: &Value) -> Vec<IpAddr> {
    svc.pointer("/spec/clusterIP")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .into_iter()
        .collect()
}

fn service_node_ports(svc: &Value) -> Vec<(i64, String)> {
    let mut out: Vec<(i64, String)> = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|ports| {
            ports
                .iter()
                .filter_map(|p| {
                    let np = p
                        .get("nodePort")
                        .and_then(Value::as_i64)
                        .filter(|n| *n != 0)?;
                    Some((
                        np,
                        p.get("protocol")
                            .and_then(Value::as_str)
                            .unwrap_or("TCP")
                            .to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    if let Some(h) = svc
        .pointer("/spec/healthCheckNodePort")
        .and_then(Value::as_i64)
        .filter(|n| *n != 0)
    {
        out.push((h, "TCP".into()));
    }
    out
}

impl Allocator {
    /// Records the addresses and ports of a stored Service.
    pub fn reserve(&mut self, svc: &Value) {
        self.ips.extend(service_ips(svc));
        self.node_ports.extend(service_node_ports(svc));
    }
    /// Forgets the addresses and ports of a Service that was replaced or deleted.
    pub fn release(&mut self, svc: &Value) {
        for ip in service_ips(svc) {
            self.ips.remove(&ip);
        }
        for np in service_node_ports(svc) {
            self.node_ports.remove(&np);
        }
    }

    fn random_v4(&self) -> Option<IpAddr> {
        let size = 1u32 << (32 - SERVICE_V4_PREFIX);
        let mut rng = rand::rng();
        // The range holds ~1M addresses; tests allocate a handful, so random probing terminates.
        (0..10_000).find_map(|_| {
            let ip = IpAddr::V4(Ipv4Addr::from(
                SERVICE_V4_BASE + rng.random_range(2..size - 1),
            ));
            (!self.ips.contains(&ip)).then_some(ip)
        })
    }
    fn random_v6(&self) -> Option<IpAddr> {
        let size = 1u128 << (128 - SERVICE_V6_PREFIX);
        let mut rng = rand::rng();
        (0..10_000).find_map(|_| {
            let ip = IpAddr::V6(Ipv6Addr::from(SERVICE_V6_BASE + rng.random_range(2..size)));
            (!self.ips.contains(&ip)).then_some(ip)
        })
    }
    fn random_node_port(&self, proto: &str, taken: &HashSet<(i64, String)>) -> Option<i64> {
        let mut rng = rand::rng();
        (0..10_000).find_map(|_| {
            let np = rng.random_range(NODE_PORTS);
            let key = (np, proto.to_string());
            (!self.node_ports.contains(&key) && !taken.contains(&key)).then_some(np)
        })
    }

    /// Validates explicit ClusterIP / NodePorts and fills in missing ones (the Service REST
    /// layer's allocation). `old` is the stored Service on update, whose own allocations are free
    /// for it to keep.
    pub fn assign(&self, svc: &mut Value, old: Option<&Value>) -> Result<(), Vec<FieldError>> {
        let mut errs = Vec::new();
        let ty = svc
            .pointer("/spec/type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP")
            .to_string();
        if ty == "ExternalName" {
            return Ok(());
        }
        let own_ips: Vec<IpAddr> = old.map(service_ips).unwrap_or_default();
        let own_ports: Vec<(i64, String)> = old.map(service_node_ports).unwrap_or_default();
        let old_ip = old
            .and_then(|o| o.pointer("/spec/clusterIP"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let spec = obj_mut(svc, "spec");
        let wants_v6 = spec
            .get("ipFamilies")
            .and_then(|f| f.get(0))
            .and_then(Value::as_str)
            .is_some_and(|f| f == "IPv6");
        let given = spec
            .get("clusterIP")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let ip_string = self.cluster_ip(&given, old_ip, wants_v6, &own_ips, &mut errs);
        let family = match ip_string.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => "IPv6",
            _ => "IPv4",
        };
        if !ip_string.is_empty() {
            spec.insert("clusterIP".into(), ip_string.clone().into());
            spec.insert("clusterIPs".into(), json!([ip_string]));
        }
        if let Some(fams) = spec.get("ipFamilies").and_then(Value::as_array)
            && !fams.is_empty()
            && fams.first().and_then(Value::as_str) != Some(family)
        {
            errs.push(FieldError::invalid(
                "spec.ipFamilies[0]",
                fams[0].clone(),
                "does not match the family of the cluster IP",
            ));
        }
        spec.insert("ipFamilies".into(), json!([family]));
        set_default(spec, "ipFamilyPolicy", "SingleStack".into());
        if spec.get("ipFamilyPolicy").and_then(Value::as_str) == Some("RequireDualStack") {
            errs.push(FieldError::invalid(
                "spec.ipFamilyPolicy",
                "RequireDualStack",
                "this cluster is not configured for dual-stack services",
            ));
        }
        if needs_node_ports(&ty) {
            self.assign_node_ports(spec, &ty, &own_ports, &mut errs);
        }
        if errs.is_empty() { Ok(()) } else { Err(errs) }
    }

    /// The cluster IP a Service gets: a free one of its family when it names none, else the one it
    /// names, checked (unchanged once set, inside the service range, not taken by another
    /// Service). "" when none is free.
    fn cluster_ip(
        &self,
        given: &str,
        old_ip: &str,
        wants_v6: bool,
        own_ips: &[IpAddr],
        errs: &mut Vec<FieldError>,
    ) -> String {
        if given.is_empty() {
            match if wants_v6 {
                self.random_v6()
            } else {
                self.random_v4()
            } {
                Some(ip) => ip.to_string(),
                None => {
                    errs.push(FieldError::invalid("spec.clusterIPs", "", "range is full"));
                    String::new()
                }
            }
        } else {
            if !old_ip.is_empty() && given != old_ip {
                errs.push(FieldError::invalid(
                    "spec.clusterIPs[0]",
                    given,
                    "may not change once set",
                ));
            }
            // An unparsable address is reported by validation.
            if given != "None"
                && given != old_ip
                && let Ok(ip) = given.parse::<IpAddr>()
            {
                if let Err(range) = in_service_range(ip) {
                    errs.push(FieldError::invalid(
                        "spec.clusterIPs[0]",
                        given,
                        format!("failed to allocate IP {given}: the provided IP ({given}) is not in the valid range. The range of valid IPs is {range}"),
                    ));
                } else if self.ips.contains(&ip) && !own_ips.contains(&ip) {
                    errs.push(FieldError::invalid(
                        "spec.clusterIPs[0]",
                        given,
                        format!("failed to allocate IP {given}: provided IP is already allocated"),
                    ));
                }
            }
            given.to_string()
        }
    }

    /// Node ports for a NodePort or LoadBalancer Service's ports: each one asked for checked
    /// (in range, not taken), the others allocated unless a LoadBalancer turns allocation off;
    /// a LoadBalancer with `externalTrafficPolicy: Local` also gets a health-check node port.
    fn assign_node_ports(
        &self,
        spec: &mut Map<String, Value>,
        ty: &str,
        own_ports: &[(i64, String)],
        errs: &mut Vec<FieldError>,
    ) {
        // A LoadBalancer with allocateLoadBalancerNodePorts=false gets none it did not ask for.
        let allocate = ty == "NodePort"
            || spec
                .get("allocateLoadBalancerNodePorts")
                .and_then(Value::as_bool)
                != Some(false);
        let mut taken: HashSet<(i64, String)> = HashSet::new();
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for (i, p) in ports.iter_mut().enumerate() {
                let proto = p
                    .get("protocol")
                    .and_then(Value::as_str)
                    .unwrap_or("TCP")
                    .to_string();
                let Some(pm) = p.as_object_mut() else {
                    continue;
                };
                match pm
                    .get("nodePort")
                    .and_then(Value::as_i64)
                    .filter(|n| *n != 0)
                {
                    Some(np) => {
                        let key = (np, proto.clone());
                        if !NODE_PORTS.contains(&np) {
                            errs.push(FieldError::invalid(
                                format!("spec.ports[{i}].nodePort"),
                                np,
                                format!("provided port is not in the valid range. The range of valid ports is {}-{}", NODE_PORTS.start(), NODE_PORTS.end()),
                            ));
                        } else if (self.node_ports.contains(&key) && !own_ports.contains(&key))
                            || taken.contains(&key)
                        {
                            errs.push(FieldError::invalid(
                                format!("spec.ports[{i}].nodePort"),
                                np,
                                "provided port is already allocated",
                            ));
                        }
                        taken.insert(key);
                    }
                    None if !allocate => {}
                    None => match self.random_node_port(&proto, &taken) {
                        Some(np) => {
                            taken.insert((np, proto));
                            pm.insert("nodePort".into(), np.into());
                        }
                        None => errs.push(FieldError::invalid(
                            format!("spec.ports[{i}].nodePort"),
                            0,
                            "range is full",
                        )),
                    },
                }
            }
        }
        if ty == "LoadBalancer"
            && spec.get("externalTrafficPolicy").and_then(Value::as_str) == Some("Local")
            && spec
                .get("healthCheckNodePort")
                .and_then(Value::as_i64)
                .is_none_or(|n| n == 0)
            && let Some(np) = self.random_node_port("TCP", &taken)
        {
            spec.insert("healthCheckNodePort".into(), np.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_range_bounds() {
        assert!(in_service_range("10.96.0.1".parse().unwrap()).is_ok());
        assert!(in_service_range("10.111.255.254".parse().unwrap()).is_ok());
        assert!(in_service_range("10.111.255.255".parse().unwrap()).is_err());
        assert!(in_service_range("10.96.0.0".parse().unwrap()).is_err());
        assert!(in_service_range("10.112.0.1".parse().unwrap()).is_err());
        assert!(in_service_range("fd00:10:96::a".parse().unwrap()).is_ok());
        assert!(in_service_range("fd00:10:97::a".parse().unwrap()).is_err());
    }
}
