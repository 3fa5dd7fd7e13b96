//! Validation of the networking built-ins controllers write: Service spec and status,
//! Endpoints, and EndpointSlices (`pkg/apis/core/validation` and
//! `pkg/apis/discovery/validation` in Kubernetes).

use std::collections::HashSet;
use std::net::IpAddr;

use serde_json::Value;

use super::{
    PORT_RANGE_MSG, PROTOCOLS, arr, dns1123_label_errors, dns1123_subdomain_errors, non_special_ip,
    port_name_errors, qualified_name_errors, str_at, validate_label_map,
};
use crate::status::FieldError;

fn port_number(v: Option<&Value>) -> Option<i64> {
    v.and_then(Value::as_i64)
}

pub(crate) fn validate_service(obj: &Value, errs: &mut Vec<FieldError>) {
    let ty = str_at(obj, "/spec/type");
    if !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&ty) {
        errs.push(FieldError::not_supported(
            "spec.type",
            ty,
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        ));
    }
    let cluster_ip = str_at(obj, "/spec/clusterIP");
    if ty == "ExternalName" {
        if !cluster_ip.is_empty() {
            errs.push(FieldError::forbidden(
                "spec.clusterIPs",
                "may not be set for ExternalName services",
            ));
        }
        let en = str_at(obj, "/spec/externalName");
        if en.is_empty() {
            errs.push(FieldError::required("spec.externalName", ""));
        } else {
            for m in dns1123_subdomain_errors(en.trim_end_matches('.')) {
                errs.push(FieldError::invalid("spec.externalName", en, m));
            }
        }
    } else if !cluster_ip.is_empty()
        && cluster_ip != "None"
        && cluster_ip.parse::<IpAddr>().is_err()
    {
        errs.push(FieldError::invalid(
            "spec.clusterIPs[0]",
            cluster_ip,
            "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
        ));
    }
    validate_service_ports(obj, ty, cluster_ip, errs);
    validate_label_map(obj.pointer("/spec/selector"), "spec.selector", errs);
    let affinity = str_at(obj, "/spec/sessionAffinity");
    if !["None", "ClientIP"].contains(&affinity) {
        errs.push(FieldError::not_supported(
            "spec.sessionAffinity",
            affinity,
            &["ClientIP", "None"],
        ));
    }
    if let Some(t) = obj
        .pointer("/spec/sessionAffinityConfig/clientIP/timeoutSeconds")
        .and_then(Value::as_i64)
        && !(1..=86400).contains(&t)
    {
        errs.push(FieldError::invalid(
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            t,
            "must be greater than 0 and less than 86400",
        ));
    }
    for (field, pointer) in [
        ("spec.internalTrafficPolicy", "/spec/internalTrafficPolicy"),
        ("spec.externalTrafficPolicy", "/spec/externalTrafficPolicy"),
    ] {
        if let Some(v) = obj.pointer(pointer).and_then(Value::as_str)
            && !["Cluster", "Local"].contains(&v)
        {
            errs.push(FieldError::not_supported(field, v, &["Cluster", "Local"]));
        }
    }
    if let Some(v) = obj
        .pointer("/spec/externalTrafficPolicy")
        .and_then(Value::as_str)
        && !matches!(ty, "NodePort" | "LoadBalancer")
    {
        errs.push(FieldError::invalid(
            "spec.externalTrafficPolicy",
            v,
            "may only be set for externally-accessible services",
        ));
    }
}

/// The ports of a Service: required unless it is ExternalName or headless, named (DNS-1123
/// labels, unique) when more than one, valid numbers, protocols and target ports, no node port
/// on a ClusterIP or ExternalName Service, and no port and protocol twice.
fn validate_service_ports(obj: &Value, ty: &str, cluster_ip: &str, errs: &mut Vec<FieldError>) {
    let ports = arr(obj, "/spec/ports");
    if ports.is_empty() && ty != "ExternalName" && cluster_ip != "None" {
        errs.push(FieldError::required("spec.ports", ""));
    }
    let mut names = HashSet::new();
    let mut keys = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let base = format!("spec.ports[{i}]");
        let name = str_at(p, "/name");
        if name.is_empty() {
            if ports.len() > 1 {
                errs.push(FieldError::required(format!("{base}.name"), ""));
            }
        } else {
            for m in dns1123_label_errors(name) {
                errs.push(FieldError::invalid(format!("{base}.name"), name, m));
            }
            if !names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(format!("{base}.name"), name));
            }
        }
        let port = port_number(p.get("port"));
        match port {
            Some(n) if (1..=65535).contains(&n) => {}
            _ => errs.push(FieldError::invalid(
                format!("{base}.port"),
                p.get("port").cloned().unwrap_or(Value::from(0)),
                PORT_RANGE_MSG,
            )),
        }
        let proto = str_at(p, "/protocol");
        if !PROTOCOLS.contains(&proto) {
            errs.push(FieldError::not_supported(
                format!("{base}.protocol"),
                proto,
                &PROTOCOLS,
            ));
        }
        match p.get("targetPort") {
            Some(Value::Number(n)) if !(1..=65535).contains(&n.as_i64().unwrap_or(0)) => {
                errs.push(FieldError::invalid(
                    format!("{base}.targetPort"),
                    Value::Number(n.clone()),
                    PORT_RANGE_MSG,
                ));
            }
            Some(Value::String(s)) => {
                for m in port_name_errors(s) {
                    errs.push(FieldError::invalid(
                        format!("{base}.targetPort"),
                        s.as_str(),
                        m,
                    ));
                }
            }
            _ => {}
        }
        if (ty == "ClusterIP" || ty == "ExternalName")
            && port_number(p.get("nodePort")).is_some_and(|n| n != 0)
        {
            errs.push(FieldError::forbidden(
                format!("{base}.nodePort"),
                format!("may not be used when `type` is '{ty}'"),
            ));
        }
        if !keys.insert((port, proto.to_string())) {
            errs.push(FieldError::duplicate(base, p.clone()));
        }
    }
}

/// `ValidateServiceStatusUpdate`: load-balancer status only on LoadBalancer services (since
/// Kubernetes 1.29 the `AllowServiceLBStatusOnNonLB` gate is off).
pub(crate) fn validate_service_status(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ingress = arr(obj, "/status/loadBalancer/ingress");
    if !ingress.is_empty() && str_at(obj, "/spec/type") != "LoadBalancer" {
        errs.push(FieldError::forbidden(
            "status.loadBalancer.ingress",
            "may only be used when `spec.type` is 'LoadBalancer'",
        ));
    }
    for (i, ing) in ingress.iter().enumerate() {
        let ip = str_at(ing, "/ip");
        if !ip.is_empty() && ip.parse::<IpAddr>().is_err() {
            errs.push(FieldError::invalid(
                format!("status.loadBalancer.ingress[{i}].ip"),
                ip,
                "must be a valid IP address",
            ));
        }
        let host = str_at(ing, "/hostname");
        if !host.is_empty() {
            for m in dns1123_subdomain_errors(host) {
                errs.push(FieldError::invalid(
                    format!("status.loadBalancer.ingress[{i}].hostname"),
                    host,
                    m,
                ));
            }
            if host.parse::<IpAddr>().is_ok() {
                errs.push(FieldError::invalid(
                    format!("status.loadBalancer.ingress[{i}].hostname"),
                    host,
                    "must be a DNS name, not an IP address",
                ));
            }
        }
        if let Some(mode) = ing.get("ipMode").and_then(Value::as_str) {
            if !["VIP", "Proxy"].contains(&mode) {
                errs.push(FieldError::not_supported(
                    format!("status.loadBalancer.ingress[{i}].ipMode"),
                    mode,
                    &["Proxy", "VIP"],
                ));
            }
            if ip.is_empty() {
                errs.push(FieldError::forbidden(
                    format!("status.loadBalancer.ingress[{i}].ipMode"),
                    "may not be specified when `ip` is not set",
                ));
            }
        }
    }
    errs
}

pub(crate) fn validate_endpoints(obj: &Value, errs: &mut Vec<FieldError>) {
    for (i, ss) in arr(obj, "/subsets").iter().enumerate() {
        let base = format!("subsets[{i}]");
        let ready = arr(ss, "/addresses");
        let not_ready = arr(ss, "/notReadyAddresses");
        if ready.is_empty() && not_ready.is_empty() {
            errs.push(FieldError::required(
                &base,
                "must specify `addresses` or `notReadyAddresses`",
            ));
        }
        for (list, addrs) in [("addresses", ready), ("notReadyAddresses", not_ready)] {
            for (j, a) in addrs.iter().enumerate() {
                let field = format!("{base}.{list}[{j}].ip");
                let ip = str_at(a, "/ip");
                match ip.parse::<IpAddr>() {
                    Ok(parsed) => non_special_ip(parsed, &field, ip, errs),
                    Err(_) => errs.push(FieldError::invalid(
                        field,
                        ip,
                        "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                    )),
                }
                let host = str_at(a, "/hostname");
                if !host.is_empty() {
                    for m in dns1123_label_errors(host) {
                        errs.push(FieldError::invalid(
                            format!("{base}.{list}[{j}].hostname"),
                            host,
                            m,
                        ));
                    }
                }
            }
        }
        let ports = arr(ss, "/ports");
        if ports.is_empty() {
            errs.push(FieldError::required(format!("{base}.ports"), ""));
        }
        let mut names = HashSet::new();
        for (k, p) in ports.iter().enumerate() {
            let pb = format!("{base}.ports[{k}]");
            let name = str_at(p, "/name");
            if name.is_empty() {
                if ports.len() > 1 {
                    errs.push(FieldError::required(format!("{pb}.name"), ""));
                }
            } else {
                for m in dns1123_label_errors(name) {
                    errs.push(FieldError::invalid(format!("{pb}.name"), name, m));
                }
            }
            if !names.insert(name.to_string()) && !name.is_empty() {
                errs.push(FieldError::duplicate(format!("{pb}.name"), name));
            }
            if !port_number(p.get("port")).is_some_and(|n| (1..=65535).contains(&n)) {
                errs.push(FieldError::invalid(
                    format!("{pb}.port"),
                    p.get("port").cloned().unwrap_or(Value::from(0)),
                    PORT_RANGE_MSG,
                ));
            }
            let proto = str_at(p, "/protocol");
            if !PROTOCOLS.contains(&proto) {
                errs.push(FieldError::not_supported(
                    format!("{pb}.protocol"),
                    proto,
                    &PROTOCOLS,
                ));
            }
        }
    }
}

/// Max endpoints / addresses / ports per EndpointSlice (discovery validation constants).
const MAX_SLICE_ENDPOINTS: usize = 1000;
const MAX_SLICE_ADDRESSES: usize = 100;
const MAX_SLICE_PORTS: usize = 100;

pub(crate) fn validate_endpoint_slice(
    obj: &Value,
    old: Option<&Value>,
    errs: &mut Vec<FieldError>,
) {
    let at = str_at(obj, "/addressType");
    if at.is_empty() {
        errs.push(FieldError::required("addressType", ""));
    } else if !["IPv4", "IPv6", "FQDN"].contains(&at) {
        errs.push(FieldError::not_supported(
            "addressType",
            at,
            &["FQDN", "IPv4", "IPv6"],
        ));
    }
    if let Some(old) = old
        && str_at(old, "/addressType") != at
    {
        errs.push(FieldError::invalid("addressType", at, "field is immutable"));
    }
    let endpoints = arr(obj, "/endpoints");
    if endpoints.len() > MAX_SLICE_ENDPOINTS {
        errs.push(FieldError::too_many(
            "endpoints",
            endpoints.len(),
            MAX_SLICE_ENDPOINTS,
        ));
    }
    for (i, ep) in endpoints.iter().enumerate() {
        let base = format!("endpoints[{i}].addresses");
        let addrs = arr(ep, "/addresses");
        if addrs.is_empty() {
            errs.push(FieldError::required(
                &base,
                "must contain at least 1 address",
            ));
        } else if addrs.len() > MAX_SLICE_ADDRESSES {
            errs.push(FieldError::too_many(
                &base,
                addrs.len(),
                MAX_SLICE_ADDRESSES,
            ));
        }
        for (j, a) in addrs.iter().enumerate() {
            let field = format!("{base}[{j}]");
            let a = a.as_str().unwrap_or_default();
            match at {
                "IPv4" | "IPv6" => {
                    let parsed = a
                        .parse::<IpAddr>()
                        .ok()
                        .filter(|ip| ip.is_ipv4() == (at == "IPv4"));
                    match parsed {
                        Some(ip) => non_special_ip(ip, &field, a, errs),
                        None => errs.push(FieldError::invalid(
                            field,
                            a,
                            format!("must be a valid {at} address"),
                        )),
                    }
                }
                "FQDN" => {
                    let mut m = dns1123_subdomain_errors(a);
                    if a.split('.').count() < 2 {
                        m.push(
                            "should be a domain with at least two segments separated by dots"
                                .into(),
                        );
                    }
                    for m in m {
                        errs.push(FieldError::invalid(&field, a, m));
                    }
                }
                _ => {}
            }
        }
        if let Some(h) = ep.get("hostname").and_then(Value::as_str) {
            for m in dns1123_label_errors(h) {
                errs.push(FieldError::invalid(
                    format!("endpoints[{i}].hostname"),
                    h,
                    m,
                ));
            }
        }
    }
    validate_slice_ports(obj, errs);
}

/// The ports of an EndpointSlice: at most the API's bound, names unique (unnamed ones too) and
/// DNS-1123 labels, a supported protocol, an `appProtocol` that is a qualified name.
fn validate_slice_ports(obj: &Value, errs: &mut Vec<FieldError>) {
    let ports = arr(obj, "/ports");
    if ports.len() > MAX_SLICE_PORTS {
        errs.push(FieldError::too_many("ports", ports.len(), MAX_SLICE_PORTS));
    }
    let mut names = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let name = str_at(p, "/name");
        if !name.is_empty() {
            for m in dns1123_label_errors(name) {
                errs.push(FieldError::invalid(format!("ports[{i}].name"), name, m));
            }
        }
        // Unnamed ports collide with each other too: "" is a name here.
        if !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(format!("ports[{i}].name"), name));
        }
        match p.get("protocol").and_then(Value::as_str) {
            None => errs.push(FieldError::required(format!("ports[{i}].protocol"), "")),
            Some(proto) if !PROTOCOLS.contains(&proto) => errs.push(FieldError::not_supported(
                format!("ports[{i}].protocol"),
                proto,
                &PROTOCOLS,
            )),
            Some(_) => {}
        }
        if let Some(ap) = p.get("appProtocol").and_then(Value::as_str) {
            for m in qualified_name_errors(ap) {
                errs.push(FieldError::invalid(
                    format!("ports[{i}].appProtocol"),
                    ap,
                    m,
                ));
            }
        }
    }
}
