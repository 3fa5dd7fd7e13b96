//! Kubernetes error responses: every failure the fake returns flows through [`ApiError`], which
//! renders as a `metav1.Status` body with the same `reason`, `code`, `message` and `details`
//! shape a real kube-apiserver produces (see `k8s.io/apimachinery/pkg/api/errors`).

use serde_json::{Map, Value, json};

/// One field-level validation failure (`field.Error` in apimachinery), reported as a cause of a
/// 422 Invalid status.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FieldError {
    pub kind: FieldErrorKind,
    pub field: String,
    pub value: Option<Value>,
    pub detail: String,
}

/// The `field.ErrorType`s the fake produces; each maps to a `CauseType` string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FieldErrorKind {
    Required,
    Invalid,
    Duplicate,
    NotSupported,
    Forbidden,
    TooLong,
    TooMany,
    /// A message from a custom resource validator, reported verbatim.
    Custom,
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorKind::Required,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<Value>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind: FieldErrorKind::Invalid,
            field: field.into(),
            value: Some(value.into()),
            detail: detail.into(),
        }
    }
    pub fn duplicate(field: impl Into<String>, value: impl Into<Value>) -> Self {
        Self {
            kind: FieldErrorKind::Duplicate,
            field: field.into(),
            value: Some(value.into()),
            detail: String::new(),
        }
    }
    pub fn not_supported(
        field: impl Into<String>,
        value: impl Into<Value>,
        supported: &[&str],
    ) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        Self {
            kind: FieldErrorKind::NotSupported,
            field: field.into(),
            value: Some(value.into()),
            detail: format!("supported values: {}", list.join(", ")),
        }
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorKind::Forbidden,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        Self {
            kind: FieldErrorKind::TooLong,
            field: field.into(),
            value: None,
            detail: format!("must have at most {max} bytes"),
        }
    }
    /// A free-form message (from a [`crate::Validator`]) for `field`.
    pub fn custom(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: FieldErrorKind::Custom,
            field: field.into(),
            value: None,
            detail: message.into(),
        }
    }
    pub fn too_many(field: impl Into<String>, actual: usize, max: usize) -> Self {
        Self {
            kind: FieldErrorKind::TooMany,
            field: field.into(),
            value: Some(Value::from(actual)),
            detail: format!("must have at most {max} items"),
        }
    }

    fn reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid | FieldErrorKind::Custom => "FieldValueInvalid",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
        }
    }

    /// The message without the field path (`ErrorBody` in apimachinery).
    fn body(&self) -> String {
        let value = self.value.as_ref().map(render_value).unwrap_or_default();
        let (head, with_value) = match self.kind {
            FieldErrorKind::Required => ("Required value", false),
            FieldErrorKind::Invalid => ("Invalid value", true),
            FieldErrorKind::Duplicate => ("Duplicate value", true),
            FieldErrorKind::NotSupported => ("Unsupported value", true),
            FieldErrorKind::Forbidden => ("Forbidden", false),
            FieldErrorKind::TooLong => ("Too long", false),
            FieldErrorKind::TooMany => ("Too many", true),
            FieldErrorKind::Custom => return self.detail.clone(),
        };
        let mut s = head.to_string();
        if with_value {
            s.push_str(": ");
            s.push_str(&value);
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    /// `field: body`, as in `field.Error.Error()`.
    pub fn message(&self) -> String {
        if self.field.is_empty() {
            self.body()
        } else {
            format!("{}: {}", self.field, self.body())
        }
    }
}

/// Go's `%v`-ish rendering used inside field error messages: strings are quoted, numbers bare.
fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

/// A failed request: HTTP status code plus the `metav1.Status` body.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
}

/// Identifies the object an error is about: resource plural, API group and name.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Subject<'a> {
    pub group: &'a str,
    pub plural: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
}

impl Subject<'_> {
    /// `services` or `leases.coordination.k8s.io`, as in `schema.GroupResource.String()`.
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
    /// `Service` or `EndpointSlice.discovery.k8s.io`, as in `schema.GroupKind.String()`.
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
    fn details(&self, kind: &str) -> Map<String, Value> {
        let mut d = Map::new();
        if !self.name.is_empty() {
            d.insert("name".into(), self.name.into());
        }
        if !self.group.is_empty() {
            d.insert("group".into(), self.group.into());
        }
        d.insert("kind".into(), kind.into());
        d
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }
    fn with_details(mut self, details: Map<String, Value>) -> Self {
        self.details = Some(Value::Object(details));
        self
    }

    /// HTTP status code.
    pub fn code(&self) -> u16 {
        self.code
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub(crate) fn not_found(s: Subject<'_>) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", s.qualified_resource(), s.name),
        )
        .with_details(s.details(s.plural))
    }
    /// 404 for a path no resource handles.
    pub(crate) fn no_route() -> Self {
        let mut d = Map::new();
        d.insert(
            "causes".into(),
            json!([{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]),
        );
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(d)
    }
    pub(crate) fn already_exists(s: Subject<'_>) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", s.qualified_resource(), s.name),
        )
        .with_details(s.details(s.plural))
    }
    /// The optimistic-concurrency conflict (stale `metadata.resourceVersion`).
    pub(crate) fn conflict_modified(s: Subject<'_>) -> Self {
        Self::conflict(
            s,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub(crate) fn conflict(s: Subject<'_>, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {why}",
                s.qualified_resource(),
                s.name
            ),
        )
        .with_details(s.details(s.plural))
    }
    /// Server-side apply conflict; `causes` are `(manager, apiVersion, field path)`.
    pub(crate) fn apply_conflict(s: Subject<'_>, conflicts: &[(String, String, String)]) -> Self {
        let n = conflicts.len();
        let mut message = format!(
            "Apply failed with {n} conflict{}: ",
            if n == 1 { "" } else { "s" }
        );
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(m, v, f)| format!("conflict with \"{m}\" using {v}: {f}"))
            .collect();
        message.push_str(&lines.join("\n"));
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, v, f)| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\" using {v}"), "field": f})
            })
            .collect();
        let mut d = s.details(s.plural);
        d.insert("causes".into(), Value::Array(causes));
        Self::new(409, "Conflict", message).with_details(d)
    }
    /// 422 with field causes, like `errors.NewInvalid`.
    pub(crate) fn invalid(s: Subject<'_>, errors: &[FieldError]) -> Self {
        let joined = if errors.len() == 1 {
            errors[0].message()
        } else {
            format!(
                "[{}]",
                errors
                    .iter()
                    .map(FieldError::message)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.reason(), "message": e.body(), "field": e.field}))
            .collect();
        let mut d = s.details(s.kind);
        d.insert("causes".into(), Value::Array(causes));
        Self::new(
            422,
            "Invalid",
            format!("{} \"{}\" is invalid: {joined}", s.qualified_kind(), s.name),
        )
        .with_details(d)
    }
    /// 422 without a subject, e.g. invalid patch options.
    pub(crate) fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }
    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }
    pub(crate) fn unsupported_media_type(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }
    pub(crate) fn too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "the request body exceeds the 3 MiB limit",
        )
    }
    pub(crate) fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    /// What a real server answers (after a wait) for a resourceVersion it has not reached yet.
    pub(crate) fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut d = Map::new();
        d.insert(
            "causes".into(),
            json!([{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]),
        );
        d.insert("retryAfterSeconds".into(), 1.into());
        Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        )
        .with_details(d)
    }
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `metav1.Status` JSON body.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(d), Some(obj)) = (&self.details, s.as_object_mut()) {
            obj.insert("details".into(), d.clone());
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// `metav1.Status` with `status: Success`, returned by deletes of resources that do not return
/// the deleted object.
pub(crate) fn success_status(s: Subject<'_>, uid: &str) -> Value {
    let mut details = s.details(s.plural);
    details.insert("uid".into(), uid.into());
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_status_matches_apimachinery_shape() {
        let s = Subject {
            group: "",
            plural: "services",
            kind: "Service",
            name: "web",
        };
        let e = ApiError::invalid(
            s,
            &[
                FieldError::required("spec.ports[0].name", ""),
                FieldError::invalid(
                    "spec.ports[1].port",
                    0,
                    "must be between 1 and 65535, inclusive",
                ),
            ],
        );
        assert_eq!(
            e.to_status(),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Service \"web\" is invalid: [spec.ports[0].name: Required value, spec.ports[1].port: Invalid value: 0: must be between 1 and 65535, inclusive]",
                "reason": "Invalid", "code": 422,
                "details": {"name": "web", "kind": "Service", "causes": [
                    {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.ports[0].name"},
                    {"reason": "FieldValueInvalid", "message": "Invalid value: 0: must be between 1 and 65535, inclusive", "field": "spec.ports[1].port"}
                ]}
            })
        );
    }

    #[test]
    fn not_found_for_group_resource_names_the_group() {
        let s = Subject {
            group: "coordination.k8s.io",
            plural: "leases",
            kind: "Lease",
            name: "x",
        };
        let st = ApiError::not_found(s).to_status();
        assert_eq!(st["message"], "leases.coordination.k8s.io \"x\" not found");
        assert_eq!(
            st["details"],
            json!({"name": "x", "group": "coordination.k8s.io", "kind": "leases"})
        );
        assert_eq!(st["code"], 404);
    }

    #[test]
    fn not_supported_lists_values() {
        let e = FieldError::not_supported("spec.type", "Bogus", &["ClusterIP", "NodePort"]);
        assert_eq!(
            e.message(),
            "spec.type: Unsupported value: \"Bogus\": supported values: \"ClusterIP\", \"NodePort\""
        );
    }
}
