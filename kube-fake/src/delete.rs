//! DELETE of one object: preconditions, then the object is gone at once. There is no garbage
//! collection, no finalizer handling and no namespace termination (`propagationPolicy` is
//! accepted and ignored); the tests kept on the fake delete nothing that depends on them.

use std::sync::Arc;

use serde_json::Value;

use crate::meta::meta_str;
use crate::resources::Resource;
use crate::status::{self, ApiError};
use crate::store::{Store, key, present};

/// The parts of `DeleteOptions` the fake honours.
#[derive(Clone, Debug)]
pub(crate) struct DeleteOpts {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
}

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
        for (what, want, have) in [
            ("UID", &opts.uid, meta_str(&current, "uid")),
            (
                "ResourceVersion",
                &opts.resource_version,
                meta_str(&current, "resourceVersion"),
            ),
        ] {
            if let Some(want) = want
                && want != have
            {
                return Err(ApiError::conflict(
                    res.subject(name),
                    &format!(
                        "Precondition failed: {what} in precondition: {want}, {what} in object meta: {have}"
                    ),
                ));
            }
        }
        if opts.dry_run {
            return Ok((200, present(&current, res), false));
        }
        let gone = self.take(res, &k, None).unwrap_or(current);
        let body = if res.behavior.return_deleted_object {
            present(&gone, res)
        } else {
            status::success_status(res.subject(name), meta_str(&gone, "uid"))
        };
        Ok((200, body, true))
    }
}
