//! JSON merge patch (RFC 7386), the only non-apply PATCH the product sends. It turns the live
//! object into a candidate object that then goes through the normal update pipeline. JSON patch
//! and strategic merge patch are answered 415.

use serde_json::Value;

use crate::status::ApiError;

/// RFC 7386 merge patch.
pub(crate) fn merge_patch(target: &Value, patch: &[u8]) -> Result<Value, ApiError> {
    let patch: Value = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    if !patch.is_object() {
        return Err(ApiError::bad_request("merge patch must be a JSON object"));
    }
    let mut out = target.clone();
    json_patch::merge(&mut out, &patch);
    Ok(out)
}
