//! The create and update pipelines (POST, PUT, PATCH, apply, on the main resource or `/status`),
//! in the order the apiserver runs them: decode checks, preconditions (resourceVersion, uid),
//! subresource isolation, system metadata, defaulting, validation, allocation, managed fields,
//! generation, and finally the no-op check — an update that changes nothing is not written, keeps
//! its resourceVersion and emits no watch event.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::apply;
use crate::defaults;
use crate::fields::{self, Entry, Scope, Writer};
use crate::meta::{self, meta_str, set_meta};
use crate::resources::{Builtin, GenerationPolicy, Resource};
use crate::status::{ApiError, FieldError};
use crate::store::{Store, key, present};
use crate::validation;

/// Who writes what, where.
pub(crate) struct WriteReq<'a> {
    pub res: &'a Arc<Resource>,
    /// Namespace from the URL ("" for cluster-scoped resources).
    pub namespace: &'a str,
    /// Name from the URL ("" for POST).
    pub name: &'a str,
    pub scope: Scope,
    pub manager: &'a str,
    pub dry_run: bool,
}

/// Computes a patched object from the current one.
pub(crate) type PatchFn<'a> = Box<dyn FnOnce(&Value) -> Result<Value, ApiError> + 'a>;

/// How the new object is derived from the stored one.
pub(crate) enum Mutation<'a> {
    /// PUT: the body is the new object.
    Replace(Value),
    /// Merge patch applied to the current object.
    Patch(PatchFn<'a>),
    /// Server-side apply.
    Apply { cfg: Value, force: bool },
}

/// The response to a write, and whether stored state changed.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub code: u16,
    pub body: Value,
    pub changed: bool,
}

/// Fills in or checks `apiVersion` and `kind` against the requested resource.
fn check_type_meta(res: &Resource, obj: &mut Value) -> Result<(), ApiError> {
    let Some(m) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    };
    let want_av = res.api_version();
    match m.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            m.insert("apiVersion".into(), want_av.clone().into());
        }
        Some(av) if av == want_av => {}
        Some(av) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            )));
        }
    }
    match m.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            m.insert("kind".into(), res.spec.kind.clone().into());
        }
        Some(k) if k == res.spec.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "{k} in version \"{}\" cannot be handled as a {}: the kind in the data does not match the requested resource",
                res.spec.version, res.spec.kind
            )));
        }
    }
    Ok(())
}

/// Fills in or checks `metadata.namespace` against the URL.
fn check_namespace(res: &Resource, obj: &mut Value, url_ns: &str) -> Result<(), ApiError> {
    let body_ns = meta_str(obj, "namespace").to_string();
    if !res.spec.namespaced {
        if !body_ns.is_empty() {
            set_meta(obj, "namespace", None);
        }
        return Ok(());
    }
    if body_ns.is_empty() {
        set_meta(obj, "namespace", Some(url_ns.into()));
    } else if body_ns != url_ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

fn content_without_metadata(v: &Value) -> Vec<(&String, &Value)> {
    v.as_object()
        .map(|m| m.iter().filter(|(k, _)| *k != "metadata").collect())
        .unwrap_or_default()
}

/// The checks an update's new object must pass before anything of it is kept: type meta, the
/// name (a PUT's body must name the URL's object; a patch may leave it out), the namespace, the
/// resourceVersion precondition (a PUT must carry one unless the resource allows unconditional
/// updates) and an unchanged uid.
fn check_update_preconditions(
    req: &WriteReq<'_>,
    old: &Value,
    new: &mut Value,
    is_put: bool,
) -> Result<(), ApiError> {
    let res = req.res;
    check_type_meta(res, new)?;
    let body_name = meta_str(new, "name");
    if body_name != req.name {
        if is_put || !body_name.is_empty() {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                req.name
            )));
        }
        set_meta(new, "name", Some(req.name.into()));
    }
    check_namespace(res, new, req.namespace)?;
    let old_rv = meta_str(old, "resourceVersion");
    let new_rv = meta_str(new, "resourceVersion");
    if !new_rv.is_empty() {
        if new_rv != old_rv {
            return Err(ApiError::conflict_modified(res.subject(req.name)));
        }
    } else if is_put && !res.behavior.allow_unconditional_update {
        return Err(ApiError::invalid(
            res.subject(req.name),
            &[FieldError::invalid(
                "metadata.resourceVersion",
                "0x0",
                "must be specified for an update",
            )],
        ));
    }
    let new_uid = meta_str(new, "uid");
    if !new_uid.is_empty() && new_uid != meta_str(old, "uid") {
        return Err(ApiError::invalid(
            res.subject(req.name),
            &[FieldError::invalid(
                "metadata.uid",
                new_uid,
                "field is immutable",
            )],
        ));
    }
    Ok(())
}

/// What an update cannot change, taken from the stored object: the status on the main resource
/// when the resource has a status subresource, everything but the status on `/status`, and the
/// system metadata (uid, timestamps, resourceVersion); `selfLink` is dropped.
fn keep_stored_parts(req: &WriteReq<'_>, old: &Value, new: &mut Value) {
    match req.scope {
        Scope::Main if req.res.spec.status_subresource => {
            if let Some(m) = new.as_object_mut() {
                match old.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
        }
        Scope::Main => {}
        Scope::Status => {
            // Only status changes; metadata and spec stay as stored.
            let status = new.get("status").cloned();
            *new = old.clone();
            if let Some(m) = new.as_object_mut() {
                match status {
                    Some(s) => m.insert("status".into(), s),
                    None => m.remove("status"),
                };
            }
        }
    }
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
    ] {
        set_meta(new, f, old.get("metadata").and_then(|m| m.get(f)).cloned());
    }
    set_meta(new, "selfLink", None);
}

/// Sets `metadata.generation` from `old` and bumps it per the resource's policy.
fn set_generation(res: &Resource, old: &Value, new: &mut Value, scope: Scope) {
    let old_gen = old.pointer("/metadata/generation").and_then(Value::as_i64);
    let mut generation = old_gen;
    if scope == Scope::Main {
        let labels_changed = old.pointer("/metadata/labels") != new.pointer("/metadata/labels");
        let content_changed = content_without_metadata(old) != content_without_metadata(new);
        let bump = match res.behavior.generation {
            GenerationPolicy::Never => false,
            GenerationPolicy::OutsideMetadata => content_changed,
            GenerationPolicy::OutsideMetadataOrLabels => content_changed || labels_changed,
        };
        if bump {
            generation = Some(old_gen.unwrap_or(0) + 1);
        }
    }
    set_meta(new, "generation", generation.map(Value::from));
}

impl Store {
    fn validate_all(
        &self,
        res: &Resource,
        obj: &mut Value,
        old: Option<&Value>,
        scope: Scope,
    ) -> Vec<FieldError> {
        let mut errs = validation::validate(res, obj, old);
        if res.is(Builtin::Service) {
            if scope == Scope::Status {
                errs.extend(validation::validate_service_status(obj));
            }
            if errs.is_empty()
                && scope == Scope::Main
                && let Err(e) = self.alloc.assign(obj, old)
            {
                errs.extend(e);
            }
        }
        errs
    }

    /// POST (and PUT or apply on an absent object where the resource allows it).
    pub fn create(
        &mut self,
        req: &WriteReq<'_>,
        mut obj: Value,
        applied: Option<Vec<Entry>>,
    ) -> Result<Outcome, ApiError> {
        let res = req.res;
        check_type_meta(res, &mut obj)?;
        check_namespace(res, &mut obj, req.namespace)?;
        let mut name = meta_str(&obj, "name").to_string();
        if name.is_empty() && !req.name.is_empty() {
            name = req.name.to_string();
            set_meta(&mut obj, "name", Some(name.clone().into()));
        }
        if name.is_empty() {
            let generate = meta_str(&obj, "generateName").to_string();
            if generate.is_empty() {
                return Err(ApiError::invalid(
                    res.subject(""),
                    &[FieldError::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
            name = format!("{generate}{}", meta::name_suffix());
            set_meta(&mut obj, "name", Some(name.clone().into()));
        }
        if !req.name.is_empty() && name != req.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({name}) does not match the name on the URL ({})",
                req.name
            )));
        }
        if !meta_str(&obj, "resourceVersion").is_empty() {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        if res.spec.namespaced {
            let ns_res = self
                .registry
                .find("", "v1", "namespaces")
                .ok_or_else(|| ApiError::internal("no namespaces"))?;
            if self.get(&key(&ns_res, "", req.namespace)).is_none() {
                return Err(ApiError::not_found(ns_res.subject(req.namespace)));
            }
        }
        let now = meta::now();
        {
            let m = meta::meta_mut(&mut obj);
            for f in [
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
                "managedFields",
                "generation",
            ] {
                m.remove(f);
            }
            m.insert("uid".into(), meta::new_uid().into());
            m.insert("creationTimestamp".into(), now.clone().into());
            if res.behavior.generation != GenerationPolicy::Never {
                m.insert("generation".into(), 1.into());
            }
        }
        if res.behavior.drop_status_on_create
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        if let Some(schema) = &res.schema {
            schema.prune(&mut obj);
            schema.apply_defaults(&mut obj);
        }
        defaults::apply(res, &mut obj, None)?;
        let errs = self.validate_all(res, &mut obj, None, Scope::Main);
        if !errs.is_empty() {
            return Err(ApiError::invalid(res.subject(&name), &errs));
        }
        let k = key(res, req.namespace, &name);
        if self.get(&k).is_some() {
            return Err(ApiError::already_exists(res.subject(&name)));
        }
        let entries = match applied {
            Some(e) => e,
            None => {
                let mut e = Vec::new();
                let w = Writer {
                    manager: req.manager,
                    api_version: &res.api_version(),
                    now: &now,
                    scope: Scope::Main,
                };
                fields::track_update(&mut e, None, &obj, res, &w);
                e
            }
        };
        fields::write_entries(&mut obj, &entries);
        if req.dry_run {
            return Ok(Outcome {
                code: 201,
                body: obj,
                changed: false,
            });
        }
        let stored = self.put(res, k, obj);
        Ok(Outcome {
            code: 201,
            body: present(&stored, res),
            changed: true,
        })
    }

    /// PUT, PATCH and apply of an existing object.
    pub fn update(
        &mut self,
        req: &WriteReq<'_>,
        mutation: Mutation<'_>,
    ) -> Result<Outcome, ApiError> {
        let res = req.res;
        let k = key(res, req.namespace, req.name);
        let now = meta::now();
        let api_version = res.api_version();
        let w = Writer {
            manager: req.manager,
            api_version: &api_version,
            now: &now,
            scope: req.scope,
        };
        let Some(stored) = self.get(&k).cloned() else {
            return self.update_missing(req, mutation, &w);
        };
        let old = present(&stored, res);
        let old_rv = meta_str(&old, "resourceVersion").to_string();
        let (mut new, applied, is_put) = match mutation {
            Mutation::Replace(body) => (body, None, true),
            Mutation::Patch(f) => (f(&old)?, None, false),
            Mutation::Apply { cfg, force } => {
                let rv = meta_str(&cfg, "resourceVersion");
                if !rv.is_empty() && rv != old_rv {
                    return Err(ApiError::conflict_modified(res.subject(req.name)));
                }
                let a = apply::apply(Some(&old), &cfg, res, &w, force, req.name)?;
                (a.object, Some(a.entries), false)
            }
        };
        check_update_preconditions(req, &old, &mut new, is_put)?;
        keep_stored_parts(req, &old, &mut new);
        if let Some(schema) = &res.schema {
            schema.prune(&mut new);
            schema.apply_defaults(&mut new);
        }
        defaults::apply(res, &mut new, Some(&old))?;
        let errs = self.validate_all(res, &mut new, Some(&old), req.scope);
        if !errs.is_empty() {
            return Err(ApiError::invalid(res.subject(req.name), &errs));
        }
        let entries = match applied {
            Some(e) => e,
            None => {
                let mut e = fields::read_entries(&old);
                fields::track_update(&mut e, Some(&old), &new, res, &w);
                e
            }
        };
        fields::write_entries(&mut new, &entries);
        set_generation(res, &old, &mut new, req.scope);
        if new == old {
            return Ok(Outcome {
                code: 200,
                body: old,
                changed: false,
            });
        }
        if req.dry_run {
            return Ok(Outcome {
                code: 200,
                body: new,
                changed: false,
            });
        }
        let stored = self.put(res, k, new);
        Ok(Outcome {
            code: 200,
            body: present(&stored, res),
            changed: true,
        })
    }

    /// An update of an object that does not exist: a PUT creates it where the resource allows
    /// that, an apply creates it; both only without a resourceVersion precondition. Anything
    /// else is NotFound.
    fn update_missing(
        &mut self,
        req: &WriteReq<'_>,
        mutation: Mutation<'_>,
        w: &Writer<'_>,
    ) -> Result<Outcome, ApiError> {
        let res = req.res;
        match mutation {
            Mutation::Replace(body)
                if res.behavior.allow_create_on_update && req.scope == Scope::Main =>
            {
                if !meta_str(&body, "resourceVersion").is_empty() {
                    return Err(ApiError::not_found(res.subject(req.name)));
                }
                self.create(req, body, None)
            }
            Mutation::Apply { cfg, force } if req.scope == Scope::Main => {
                if !meta_str(&cfg, "resourceVersion").is_empty() {
                    return Err(ApiError::not_found(res.subject(req.name)));
                }
                let applied = apply::apply(None, &cfg, res, w, force, req.name)?;
                let mut obj = applied.object;
                if meta_str(&obj, "name").is_empty() {
                    set_meta(&mut obj, "name", Some(req.name.into()));
                }
                self.create(req, obj, Some(applied.entries))
            }
            _ => Err(ApiError::not_found(res.subject(req.name))),
        }
    }

    /// Writes `obj` bypassing admission (for tests that need states a client cannot create).
    pub fn put_raw(&mut self, mut obj: Value) -> Result<Value, String> {
        let av = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let res = self
            .registry
            .find_kind(&av, &kind)
            .ok_or_else(|| format!("no resource serves {av} {kind}"))?;
        let name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            return Err("metadata.name is required".into());
        }
        let ns = if res.spec.namespaced {
            let ns = meta_str(&obj, "namespace").to_string();
            if ns.is_empty() {
                return Err(format!(
                    "{kind} is namespaced: metadata.namespace is required"
                ));
            }
            ns
        } else {
            String::new()
        };
        let k = key(&res, &ns, &name);
        let existing = self.get(&k).cloned();
        let m = meta::meta_mut(&mut obj);
        if m.get("uid").is_none() {
            let uid = existing
                .as_ref()
                .map(|e| meta_str(e, "uid").to_string())
                .unwrap_or_else(meta::new_uid);
            m.insert("uid".into(), uid.into());
        }
        if m.get("creationTimestamp").is_none() {
            let ts = existing
                .as_ref()
                .map(|e| meta_str(e, "creationTimestamp").to_string())
                .unwrap_or_else(meta::now);
            m.insert("creationTimestamp".into(), ts.into());
        }
        let stored = self.put(&res, k, obj);
        Ok(present(&stored, &res))
    }

    /// Creates a namespace object directly (used for the preloaded ones).
    pub fn ensure_namespace(&mut self, name: &str) {
        let Some(ns) = self.registry.find("", "v1", "namespaces") else {
            return;
        };
        if self.get(&key(&ns, "", name)).is_some() {
            return;
        }
        let req = WriteReq {
            res: &ns,
            namespace: "",
            name: "",
            scope: Scope::Main,
            manager: "kube-apiserver",
            dry_run: false,
        };
        // Only fails for names that are not DNS labels, which callers pass as test setup.
        if let Err(e) = self.create(&req, json!({"metadata": {"name": name}}), None) {
            tracing::warn!(namespace = name, error = %e, "could not create namespace");
        }
    }
}
