//! HTTP front end: parses Kubernetes REST paths (`/api/v1/...`, `/apis/{group}/{version}/...`,
//! namespaced and cluster-scoped, `/status`), query parameters and bodies, counts the request,
//! and dispatches to GET/LIST/WATCH, or the write pipelines in `write` and `gc`.
//! Every failure leaves as a `metav1.Status` body; malformed input is a 400 or 422, never a panic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::Shared;
use crate::counters::Verb;
use crate::delete::DeleteOpts;
use crate::fields::Scope;
use crate::patch;
use crate::resources::Resource;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{key, present};
use crate::watch::{self, Start, WatchSpec};
use crate::write::{Mutation, WriteReq};

/// Request bodies above this are refused, like the apiserver's 3 MiB limit.
const MAX_BODY: usize = 3 * 1024 * 1024;
/// Watch duration when the client sets no `timeoutSeconds` (the apiserver's
/// `--min-request-timeout` default).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

type Query = HashMap<String, String>;

fn json_response(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let ct = [(header::CONTENT_TYPE, "application/json")];
    (status, ct, body.to_string()).into_response()
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.code(), &e.to_status())
}

/// The single axum handler.
pub(crate) async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let query: Query = form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
        .into_owned()
        .collect();
    let path = parts.uri.path().to_string();
    tracing::debug!(method = %parts.method, %path, "request");
    match dispatch(&shared, &parts.method, &path, &query, &parts.headers, body).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(method = %parts.method, %path, error = %e, "request failed");
            error_response(&e)
        }
    }
}

async fn dispatch(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    query: &Query,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["api", v] if method == Method::GET => resource_list(shared, "", v),
        ["apis", g, v] if method == Method::GET => resource_list(shared, g, v),
        ["api", v, rest @ ..] => resource(shared, method, "", v, rest, query, headers, body).await,
        ["apis", g, v, rest @ ..] => {
            resource(shared, method, g, v, rest, query, headers, body).await
        }
        _ => Err(ApiError::no_route()),
    }
}

/// The `APIResourceList` of one group/version (404 when nothing is served there): the one
/// discovery document the product reads — the publisher asks whether `projectcontour.io/v1`
/// serves `httpproxies` before it watches them.
fn resource_list(shared: &Shared, group: &str, version: &str) -> Result<Response, ApiError> {
    let reg = shared.lock().registry.clone();
    let resources: Vec<Value> = reg
        .served(group, version)
        .map(|r| {
            json!({
                "name": r.spec.plural,
                "singularName": r.spec.kind.to_ascii_lowercase(),
                "namespaced": r.spec.namespaced,
                "kind": r.spec.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            })
        })
        .collect();
    if resources.is_empty() {
        return Err(ApiError::no_route());
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(json_response(
        200,
        &json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }),
    ))
}

/// A resolved resource URL.
struct Target {
    res: Arc<Resource>,
    namespace: Option<String>,
    name: Option<String>,
    scope: Scope,
}

fn resolve(shared: &Shared, group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
    let reg = shared.lock().registry.clone();
    let (namespace, plural, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if reg
                .find(group, version, plural)
                .is_some_and(|r| r.spec.namespaced) =>
        {
            (Some(ns.to_string()), *plural, tail)
        }
        [plural, tail @ ..] => (None, *plural, tail),
        [] => return Err(ApiError::no_route()),
    };
    let res = reg
        .find(group, version, plural)
        .ok_or_else(ApiError::no_route)?;
    if res.spec.namespaced && namespace.is_none() && !tail.is_empty() {
        return Err(ApiError::no_route());
    }
    let (name, scope) = match tail {
        [] => (None, Scope::Main),
        [name] => (Some(name.to_string()), Scope::Main),
        [name, "status"] if res.spec.status_subresource => (Some(name.to_string()), Scope::Status),
        _ => return Err(ApiError::no_route()),
    };
    Ok(Target {
        res,
        namespace,
        name,
        scope,
    })
}

fn flag(query: &Query, name: &str) -> bool {
    matches!(query.get(name).map(String::as_str), Some("true" | "1"))
}

fn selectors(res: &Resource, query: &Query) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(
        query
            .get("labelSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let mut supported: Vec<&str> = vec!["metadata.name"];
    if res.spec.namespaced {
        supported.push("metadata.namespace");
    }
    supported.extend(res.behavior.field_labels.iter().copied());
    let fields = FieldSelector::parse(
        query
            .get("fieldSelector")
            .map(String::as_str)
            .unwrap_or_default(),
        &supported,
    )
    .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

fn field_manager(query: &Query) -> Result<Option<String>, ApiError> {
    let Some(m) = query.get("fieldManager") else {
        return Ok(None);
    };
    if m.len() > 128 || m.chars().any(char::is_control) {
        return Err(ApiError::unprocessable(
            "fieldManager: Invalid value: must be no more than 128 printable characters",
        ));
    }
    Ok(Some(m.clone()))
}

/// The default manager: the user agent up to the first `/`, as the apiserver derives it.
fn manager_from_user_agent(headers: &HeaderMap) -> String {
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let prefix = ua.split('/').next().unwrap_or_default().trim();
    if prefix.is_empty() {
        "unknown".to_string()
    } else {
        prefix.to_string()
    }
}

fn dry_run(query: &Query) -> Result<bool, ApiError> {
    match query.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "Invalid dryRun value: {other:?}: supported values: \"All\""
        ))),
    }
}

async fn read_body(body: Body) -> Result<axum::body::Bytes, ApiError> {
    to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError::too_large())
}

fn parse_object(bytes: &[u8], headers: &HeaderMap) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let value: Value = if ct.starts_with("application/yaml") {
        yaml_serde::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
    } else if ct.starts_with("application/json") || ct.is_empty() {
        serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("error decoding JSON: {e}")))?
    } else {
        return Err(ApiError::unsupported_media_type(&[
            "application/json",
            "application/yaml",
        ]));
    };
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    Ok(value)
}

#[allow(clippy::too_many_arguments)]
async fn resource(
    shared: &Arc<Shared>,
    method: &Method,
    group: &str,
    version: &str,
    rest: &[&str],
    query: &Query,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let t = resolve(shared, group, version, rest)?;
    let verb = match (method, &t.name) {
        (&Method::GET, Some(_)) => Verb::Get,
        (&Method::GET, None) if flag(query, "watch") => Verb::Watch,
        (&Method::GET, None) => Verb::List,
        (&Method::POST, None) if t.scope == Scope::Main => Verb::Create,
        (&Method::PUT, Some(_)) => Verb::Update,
        (&Method::PATCH, Some(_)) => Verb::Patch,
        (&Method::DELETE, Some(_)) if t.scope == Scope::Main => Verb::Delete,
        _ => return Err(ApiError::method_not_allowed()),
    };
    let counter = t.res.counter_name(t.scope == Scope::Status);
    if t.res.spec.namespaced && t.namespace.is_none() && verb == Verb::Create {
        return Err(ApiError::method_not_allowed());
    }
    let ns = t.namespace.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let respond = |code: u16, body: Value| json_response(code, &body);
    match verb {
        Verb::Get => {
            let store = shared.lock();
            let obj = store
                .get(&key(&t.res, &ns, &name))
                .ok_or_else(|| ApiError::not_found(t.res.subject(&name)))?;
            Ok(respond(200, present(obj, &t.res)))
        }
        Verb::List => list(shared, &t, query).map(|v| respond(200, v)),
        Verb::Watch => watch_request(shared, &t, query),
        _ => {
            let bytes = read_body(body).await?;
            let manager = field_manager(query)?;
            let dry = dry_run(query)?;
            let outcome = {
                let mut store = shared.lock();
                let default_manager = manager_from_user_agent(headers);
                let mgr = manager.clone().unwrap_or(default_manager);
                let req = WriteReq {
                    res: &t.res,
                    namespace: &ns,
                    name: &name,
                    scope: t.scope,
                    manager: &mgr,
                    dry_run: dry,
                };
                let result = match verb {
                    Verb::Create => store.create(&req, parse_object(&bytes, headers)?, None),
                    Verb::Update => {
                        store.update(&req, Mutation::Replace(parse_object(&bytes, headers)?))
                    }
                    Verb::Patch => {
                        let mutation = patch_mutation(&bytes, query, headers, manager.is_some())?;
                        store.update(&req, mutation)
                    }
                    Verb::Delete => {
                        let opts = delete_opts(query, &bytes)?;
                        store
                            .delete(&t.res, &ns, &name, &opts)
                            .map(|(code, body, changed)| crate::write::Outcome {
                                code,
                                body,
                                changed,
                            })
                    }
                    _ => Err(ApiError::method_not_allowed()),
                };
                if let Ok(o) = &result
                    && o.changed
                {
                    store.writes.add(&counter, verb);
                }
                result.map(|o| (o, store.resource_version()))
            };
            let (outcome, rv) = outcome?;
            if outcome.changed {
                shared.notify(rv);
            }
            Ok(respond(outcome.code, outcome.body))
        }
    }
}

fn patch_mutation<'a>(
    bytes: &'a [u8],
    query: &Query,
    headers: &HeaderMap,
    has_manager: bool,
) -> Result<Mutation<'a>, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let ct = ct.split(';').next().unwrap_or_default().trim();
    let force = match query.get("force").map(String::as_str) {
        None | Some("") | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "invalid force value {other:?}"
            )));
        }
    };
    if force && ct != "application/apply-patch+yaml" {
        return Err(ApiError::unprocessable(
            "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch",
        ));
    }
    let accepted = [
        "application/merge-patch+json",
        "application/apply-patch+yaml",
    ];
    Ok(match ct {
        "application/merge-patch+json" => {
            Mutation::Patch(Box::new(move |old| patch::merge_patch(old, bytes)))
        }
        "application/apply-patch+yaml" => {
            if !has_manager {
                return Err(ApiError::unprocessable(
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            let cfg: Value = yaml_serde::from_slice(bytes)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
            Mutation::Apply { cfg, force }
        }
        _ => return Err(ApiError::unsupported_media_type(&accepted)),
    })
}

fn delete_opts(query: &Query, body: &[u8]) -> Result<DeleteOpts, ApiError> {
    let body: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    let pre = |f: &str| {
        body.pointer(&format!("/preconditions/{f}"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let dry_body = body
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some("All")));
    Ok(DeleteOpts {
        uid: pre("uid"),
        resource_version: pre("resourceVersion"),
        dry_run: dry_body || dry_run(query)?,
    })
}

fn list_body(
    res: &Resource,
    rv: u64,
    cont: Option<String>,
    remaining: Option<usize>,
    items: Vec<Value>,
) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = c.into();
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = r.into();
    }
    json!({"kind": format!("{}List", res.spec.kind), "apiVersion": res.api_version(), "metadata": meta, "items": items})
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

const CONTINUE_TOO_OLD: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue value from the response to start a new list";

fn list(shared: &Shared, t: &Target, query: &Query) -> Result<Value, ApiError> {
    let (labels, fields) = selectors(&t.res, query)?;
    let rv_param = query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    let rv_match = query
        .get("resourceVersionMatch")
        .map(String::as_str)
        .unwrap_or_default();
    let limit = match query.get("limit").map(String::as_str) {
        None | Some("") => 0,
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))?,
    };
    let token = query
        .get("continue")
        .map(String::as_str)
        .unwrap_or_default();
    let store = shared.lock();
    let current = store.resource_version();
    if !rv_match.is_empty() && rv_param.is_empty() {
        return Err(ApiError::bad_request(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    let (list_rv, start_after) = if !token.is_empty() {
        if !rv_param.is_empty() && rv_param != "0" {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(token)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .ok_or_else(|| ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
        let rv = decoded
            .get("rv")
            .and_then(Value::as_u64)
            .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
        if rv < store.compacted_through() {
            return Err(ApiError::gone(CONTINUE_TOO_OLD));
        }
        let ns = decoded
            .get("ns")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let name = decoded
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        (rv, Some((ns, name)))
    } else {
        match (rv_param, rv_match) {
            ("", _) | ("0", _) => (current, None),
            (rv, "Exact") => {
                let rv = parse_rv(rv)?;
                if rv > current {
                    return Err(ApiError::too_large_resource_version(rv, current));
                }
                if rv != current {
                    // Only the latest state is kept, so older exact reads look compacted.
                    return Err(ApiError::gone(format!(
                        "too old resource version: {rv} ({current})"
                    )));
                }
                (rv, None)
            }
            (rv, "" | "NotOlderThan") => {
                let rv = parse_rv(rv)?;
                if rv > current {
                    return Err(ApiError::too_large_resource_version(rv, current));
                }
                (current, None)
            }
            (_, other) => {
                return Err(ApiError::bad_request(format!(
                    "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
                )));
            }
        }
    };
    // resourceVersion=0 is served from the watch cache, which ignores limit.
    let limit = if rv_param == "0" { 0 } else { limit };
    let matched: Vec<_> = store
        .list(&t.res, t.namespace.as_deref())
        .filter(|(k, _)| {
            start_after
                .as_ref()
                .is_none_or(|(ns, name)| (&k.2, &k.3) > (ns, name))
        })
        .filter(|(_, o)| labels.matches(o) && fields.matches(o))
        .collect();
    let split = if limit > 0 && matched.len() > limit {
        limit
    } else {
        matched.len()
    };
    let (page, rest) = matched.split_at(split);
    let items: Vec<Value> = page.iter().map(|(_, o)| present(o, &t.res)).collect();
    let (cont, remaining) = match page.last() {
        Some((k, _)) if !rest.is_empty() => {
            let token = json!({"rv": list_rv, "ns": k.2, "name": k.3}).to_string();
            (
                Some(base64::engine::general_purpose::STANDARD.encode(token)),
                Some(rest.len()),
            )
        }
        _ => (None, None),
    };
    Ok(list_body(&t.res, list_rv, cont, remaining, items))
}

fn watch_request(shared: &Arc<Shared>, t: &Target, query: &Query) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(&t.res, query)?;
    let rv = query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    let start = match rv {
        "" | "0" => Start::Current,
        rv => Start::After(parse_rv(rv)?),
    };
    let timeout = match query.get("timeoutSeconds").map(String::as_str) {
        None | Some("") => DEFAULT_WATCH_TIMEOUT,
        Some(s) => Duration::from_secs(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {s:?}")))?,
        ),
    };
    let spec = WatchSpec {
        res: t.res.clone(),
        namespace: t.namespace.clone(),
        labels,
        fields,
        start,
        timeout,
    };
    let body = watch::start(shared.clone(), spec)?;
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}
