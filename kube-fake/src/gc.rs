//! Deletion: DELETE of one object (preconditions, finalizers, propagation policies) and the
//! garbage collector, run synchronously after every deletion. Deleting an owner deletes the
//! dependents all of whose owners are gone (recursively); dependents with another live owner only
//! lose the dangling references; a Foreground delete keeps the owner (with the
//! `foregroundDeletion` finalizer) until its blocking dependents are gone; Orphan strips the
//! owner reference from dependents. Objects with finalizers are only marked with a
//! `deletionTimestamp` and disappear when an update empties their finalizers. Deleting a
//! namespace marks it Terminating, deletes its content and removes it once empty.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::meta::{self, meta_str, set_meta};
use crate::resources::{Builtin, Resource};
use crate::status::{self, ApiError};
use crate::store::{ObjKey, Store, key, present};

/// `propagationPolicy` of a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Propagation {
    Background,
    Foreground,
    Orphan,
}

impl Propagation {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        match s {
            "Background" => Ok(Self::Background),
            "Foreground" => Ok(Self::Foreground),
            "Orphan" => Ok(Self::Orphan),
            other => Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: \"{other}\": supported values: \"Background\", \"Foreground\", \"Orphan\""
            ))),
        }
    }
}

/// The parts of `DeleteOptions` the fake honours.
#[derive(Clone, Debug)]
pub(crate) struct DeleteOpts {
    pub propagation: Propagation,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
}

/// Namespaces the apiserver refuses to delete.
const IMMORTAL_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];
const FOREGROUND: &str = "foregroundDeletion";

impl Store {
    /// DELETE of one object; returns the HTTP code, the body and whether state changed.
    pub fn delete(
        &mut self,
        res: &Arc<Resource>,
        namespace: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<(u16, Value, bool), ApiError> {
        let k = key(res, namespace, name);
        let Some(current) = self.get(&k).cloned() else {
            return Err(ApiError::not_found(res.subject(name)));
        };
        let uid = meta_str(&current, "uid").to_string();
        if let Some(want) = &opts.uid
            && *want != uid
        {
            return Err(ApiError::conflict(
                res.subject(name),
                &format!(
                    "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                ),
            ));
        }
        let rv = meta_str(&current, "resourceVersion").to_string();
        if let Some(want) = &opts.resource_version
            && *want != rv
        {
            return Err(ApiError::conflict(
                res.subject(name),
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"
                ),
            ));
        }
        if res.is(Builtin::Namespace) && IMMORTAL_NAMESPACES.contains(&name) {
            return Err(ApiError::forbidden(
                res.subject(name),
                "this namespace may not be deleted",
            ));
        }
        if opts.dry_run {
            return Ok((200, present(&current, res), false));
        }
        let (after, removed) = self.delete_object(res, &k, opts.propagation);
        self.gc_sweep();
        let body = if removed && !res.behavior.return_deleted_object {
            status::success_status(res.subject(name), &uid)
        } else {
            present(&after, res)
        };
        let changed = removed || *after != *current;
        Ok((200, body, changed))
    }

    /// Starts deleting one stored object; returns its state afterwards and whether it is gone.
    fn delete_object(
        &mut self,
        res: &Resource,
        k: &ObjKey,
        policy: Propagation,
    ) -> (Arc<Value>, bool) {
        let Some(current) = self.get(k).cloned() else {
            return (Arc::new(Value::Null), true);
        };
        let uid = meta_str(&current, "uid").to_string();
        if policy == Propagation::Orphan {
            self.orphan_dependents(&uid);
        }
        if meta::is_deleting(&current) {
            return (current, false);
        }
        let mut finalizers = meta::finalizers(&current);
        let is_namespace = res.is(Builtin::Namespace);
        if policy == Propagation::Foreground && !finalizers.iter().any(|f| f == FOREGROUND) {
            finalizers.push(FOREGROUND.to_string());
        }
        if finalizers.is_empty() && !is_namespace {
            let gone = self.take(res, k, None).unwrap_or(current);
            return (gone, true);
        }
        let mut marked = (*current).clone();
        set_meta(&mut marked, "deletionTimestamp", Some(meta::now().into()));
        set_meta(&mut marked, "deletionGracePeriodSeconds", Some(0.into()));
        if !finalizers.is_empty() {
            set_meta(&mut marked, "finalizers", Some(json!(finalizers)));
        }
        if is_namespace {
            marked["status"] = json!({"phase": "Terminating"});
        }
        let marked = self.put(res, k.clone(), marked);
        if is_namespace {
            let content: Vec<ObjKey> = self
                .all()
                .filter(|(ok, _)| !ok.2.is_empty() && ok.2 == k.3)
                .map(|(ok, _)| ok.clone())
                .collect();
            for ck in content {
                if let Some(cres) = self.resource_for(&ck) {
                    self.delete_object(&cres, &ck, Propagation::Background);
                }
            }
        }
        (marked, false)
    }

    /// Removes owner references to `uid` from every dependent.
    fn orphan_dependents(&mut self, uid: &str) {
        let dependents: Vec<ObjKey> = self
            .all()
            .filter(|(_, o)| meta::owner_uids(o).iter().any(|(u, _)| u == uid))
            .map(|(k, _)| k.clone())
            .collect();
        for dk in dependents {
            self.drop_owner_refs(&dk, |u| u == uid);
        }
    }

    fn drop_owner_refs(&mut self, k: &ObjKey, drop: impl Fn(&str) -> bool) {
        let (Some(res), Some(obj)) = (self.resource_for(k), self.get(k).cloned()) else {
            return;
        };
        let mut next = (*obj).clone();
        if let Some(refs) = next
            .pointer_mut("/metadata/ownerReferences")
            .and_then(Value::as_array_mut)
        {
            refs.retain(|r| !r.get("uid").and_then(Value::as_str).is_some_and(&drop));
            if refs.is_empty() {
                set_meta(&mut next, "ownerReferences", None);
            }
        }
        if next != *obj {
            self.put(&res, k.clone(), next);
        }
    }

    /// Runs the garbage collector and namespace controller to a fixed point.
    pub fn gc_sweep(&mut self) {
        // Each pass changes at least one object or stops; the bound guards against a bug looping.
        for _ in 0..10_000 {
            if !self.gc_pass() {
                return;
            }
        }
        tracing::error!("garbage collection did not converge");
    }

    fn gc_pass(&mut self) -> bool {
        enum Action {
            DropRefs(ObjKey, Vec<String>),
            Delete(ObjKey, Propagation),
            ReleaseForeground(ObjKey),
            RemoveNamespace(ObjKey),
        }
        let mut actions = Vec::new();
        for (k, obj) in self.all() {
            let refs = meta::owner_uids(obj);
            if !refs.is_empty() && !meta::is_deleting(obj) {
                let mut solid = 0;
                let mut stale = Vec::new();
                let mut waiting = false;
                for (uid, _) in &refs {
                    match self.key_of_uid(uid).and_then(|ok| self.get(ok)) {
                        None => stale.push(uid.clone()),
                        Some(owner)
                            if meta::is_deleting(owner)
                                && meta::finalizers(owner).iter().any(|f| f == FOREGROUND) =>
                        {
                            waiting = true;
                            stale.push(uid.clone());
                        }
                        Some(_) => solid += 1,
                    }
                }
                if solid > 0 && !stale.is_empty() {
                    actions.push(Action::DropRefs(k.clone(), stale));
                } else if solid == 0 {
                    let own_uid = meta_str(obj, "uid");
                    let has_dependents = self
                        .all()
                        .any(|(_, o)| meta::owner_uids(o).iter().any(|(u, _)| u == own_uid));
                    let policy = if waiting && has_dependents {
                        Propagation::Foreground
                    } else {
                        Propagation::Background
                    };
                    actions.push(Action::Delete(k.clone(), policy));
                }
            }
            if meta::is_deleting(obj) && meta::finalizers(obj).iter().any(|f| f == FOREGROUND) {
                let uid = meta_str(obj, "uid");
                let blocked = self.all().any(|(_, o)| {
                    meta::owner_uids(o)
                        .iter()
                        .any(|(u, block)| u == uid && *block)
                });
                if !blocked {
                    actions.push(Action::ReleaseForeground(k.clone()));
                }
            }
            if k.0.is_empty()
                && k.1 == "namespaces"
                && meta::is_deleting(obj)
                && meta::finalizers(obj).is_empty()
            {
                let ns = &k.3;
                if !self.all().any(|(ok, _)| !ok.2.is_empty() && ok.2 == *ns) {
                    actions.push(Action::RemoveNamespace(k.clone()));
                }
            }
        }
        let progressed = !actions.is_empty();
        for action in actions {
            match action {
                Action::DropRefs(k, uids) => {
                    self.drop_owner_refs(&k, |u| uids.iter().any(|x| x == u))
                }
                Action::Delete(k, policy) => {
                    if let Some(res) = self.resource_for(&k) {
                        self.delete_object(&res, &k, policy);
                    }
                }
                Action::ReleaseForeground(k) => {
                    let (Some(res), Some(obj)) = (self.resource_for(&k), self.get(&k).cloned())
                    else {
                        continue;
                    };
                    let mut next = (*obj).clone();
                    let rest: Vec<String> = meta::finalizers(&obj)
                        .into_iter()
                        .filter(|f| f != FOREGROUND)
                        .collect();
                    if rest.is_empty() {
                        set_meta(&mut next, "finalizers", None);
                        self.take(&res, &k, Some(next));
                    } else {
                        set_meta(&mut next, "finalizers", Some(json!(rest)));
                        self.put(&res, k, next);
                    }
                }
                Action::RemoveNamespace(k) => {
                    if let Some(res) = self.resource_for(&k) {
                        self.take(&res, &k, None);
                    }
                }
            }
        }
        progressed
    }
}
