//! `RemoteRegistry.spec.allowedDomains`: validating the list exactly as XCC v1 does and
//! matching imported FQDNs against it ([`fqdn_allowed`]).
//!
//! The validation result becomes the message of the RemoteRegistry's `Valid=False` condition, so
//! its text reproduces XCC v1 byte for byte: the Kubernetes field-error formats, the aggregate
//! list `[e1, e2]` and the `… "<name>" is invalid: …` wrapper of an API "Invalid" error. The DNS
//! name check follows miekg/dns `IsDomainName` (v1.1.35), quirks included (a leading dot is
//! accepted, the length limit is an offset rule on the wire form).

use std::fmt;

use crate::names::{API_GROUP, REMOTE_REGISTRY_KIND};

/// Detail of an empty or malformed domain (XCC v1 text, verbatim).
pub const INVALID_DOMAIN_DETAIL: &str = "Invalid domain. For example, labels in the domain name must have between 1 and 63 characters. Check RFC1035 for more details.";
/// Detail of a domain with characters outside `[A-Za-z0-9.-]` (XCC v1 text, verbatim).
pub const INVALID_CHARACTERS_DETAIL: &str = "Invalid characters. Domain names must contain only alphanumeric characters, or dots (.) and hyphens (-).";
/// Detail of a label starting or ending with `-` (XCC v1 text, verbatim).
pub const INVALID_HYPHEN_DETAIL: &str =
    "Invalid use of hyphen in label. Labels in a domain name must not start or end with `-`.";
/// Detail of an all-numeric top-level label (XCC v1 text, verbatim).
pub const INVALID_TLD_DETAIL: &str = "Invalid TLD. All-numeric TLDs are invalid.";
/// Longest accepted domain text when the DNS name check fails (the `Too long` threshold).
pub const MAX_DOMAIN_BYTES: usize = 255;
/// Wire-form length limit of miekg/dns (`lenmsg`).
const MAX_WIRE_OFFSET: usize = 256;
/// Labels of 64 octets or more do not fit the 6-bit length field.
const MAX_LABEL_OCTETS: usize = 63;

/// What kind of Kubernetes field error (`k8s.io/apimachinery/pkg/util/validation/field`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value: <detail>`.
    Required {
        /// Human-readable detail.
        detail: String,
    },
    /// `Invalid value: "<value>": <detail>`.
    Invalid {
        /// The rejected value.
        value: String,
        /// Human-readable detail.
        detail: String,
    },
    /// `Too long: must have at most <max> bytes`.
    TooLong {
        /// The limit.
        max: usize,
    },
}

/// One Kubernetes field error; `Display` renders it as apimachinery v0.19 does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Field path, e.g. `spec.allowedDomains[0]`.
    pub path: String,
    /// Type of the error with its detail.
    pub kind: FieldErrorKind,
}

impl FieldError {
    /// The error text without the leading `<path>: `.
    pub fn body(&self) -> String {
        match &self.kind {
            FieldErrorKind::Required { detail } => with_detail("Required value".into(), detail),
            FieldErrorKind::Invalid { value, detail } => {
                with_detail(format!("Invalid value: {}", go_quote(value)), detail)
            }
            FieldErrorKind::TooLong { max } => format!("Too long: must have at most {max} bytes"),
        }
    }
}

fn with_detail(mut text: String, detail: &str) -> String {
    if !detail.is_empty() {
        text.push_str(": ");
        text.push_str(detail);
    }
    text
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.body())
    }
}

impl std::error::Error for FieldError {}

/// Validate one `allowedDomains` entry at `index`, XCC v1 rules in order (first failure wins):
/// empty → Required; characters outside `[A-Za-z0-9.-]`; miekg `IsDomainName` (→ `Too long`
/// when over 255 bytes, else `Invalid domain`); a label starting or ending with `-`; an
/// all-numeric last label.
pub fn validate_domain(index: usize, domain: &str) -> Result<(), FieldError> {
    let path = format!("spec.allowedDomains[{index}]");
    let invalid = |detail: &str| FieldError {
        path: path.clone(),
        kind: FieldErrorKind::Invalid {
            value: domain.to_string(),
            detail: detail.to_string(),
        },
    };
    if domain.is_empty() {
        return Err(FieldError {
            path: path.clone(),
            kind: FieldErrorKind::Required {
                detail: INVALID_DOMAIN_DETAIL.into(),
            },
        });
    }
    if !domain
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(invalid(INVALID_CHARACTERS_DETAIL));
    }
    if !is_domain_name(domain) {
        if domain.len() > MAX_DOMAIN_BYTES {
            return Err(FieldError {
                path: path.clone(),
                kind: FieldErrorKind::TooLong {
                    max: MAX_DOMAIN_BYTES,
                },
            });
        }
        return Err(invalid(INVALID_DOMAIN_DETAIL));
    }
    let labels = split_domain_name(domain);
    if labels
        .iter()
        .any(|label| label.starts_with('-') || label.ends_with('-'))
    {
        return Err(invalid(INVALID_HYPHEN_DETAIL));
    }
    let numeric_tld = labels
        .last()
        .is_some_and(|tld| !tld.is_empty() && tld.bytes().all(|b| b.is_ascii_digit()));
    if numeric_tld {
        return Err(invalid(INVALID_TLD_DETAIL));
    }
    Ok(())
}

/// Every field error of `domains` (one per failing entry, in list order).
pub fn allowed_domain_errors(domains: &[String]) -> Vec<FieldError> {
    domains
        .iter()
        .enumerate()
        .filter_map(|(i, d)| validate_domain(i, d).err())
        .collect()
}

/// `spec.allowedDomains` of the RemoteRegistry `name` has invalid entries. `Display` is the full
/// Kubernetes "Invalid" error XCC v1 writes into the condition message, e.g.
/// `RemoteRegistry.connectivity.tanzu.vmware.com "rr" is invalid: spec.allowedDomains[0]: …`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", invalid_error_message(&format!("{REMOTE_REGISTRY_KIND}.{API_GROUP}"), .name, .errors))]
pub struct InvalidAllowedDomains {
    /// The RemoteRegistry's name.
    pub name: String,
    /// One error per failing entry, in list order (never empty).
    pub errors: Vec<FieldError>,
}

/// Validate `spec.allowedDomains` of the RemoteRegistry named `rr_name`.
pub fn validate_allowed_domains(
    rr_name: &str,
    domains: &[String],
) -> Result<(), InvalidAllowedDomains> {
    let errors = allowed_domain_errors(domains);
    if errors.is_empty() {
        return Ok(());
    }
    Err(InvalidAllowedDomains {
        name: rr_name.to_string(),
        errors,
    })
}

/// The message of an apimachinery `NewInvalid(groupKind, name, errors)`: `<groupKind> "<name>" is
/// invalid: <aggregate>`, where the aggregate drops duplicate texts and is the single error
/// itself or `[e1, e2, …]`.
pub fn invalid_error_message(group_kind: &str, name: &str, errors: &[FieldError]) -> String {
    let mut texts: Vec<String> = Vec::with_capacity(errors.len());
    for text in errors.iter().map(ToString::to_string) {
        if !texts.contains(&text) {
            texts.push(text);
        }
    }
    let aggregate = match texts.as_slice() {
        [] => "<nil>".to_string(),
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    format!("{group_kind} {} is invalid: {aggregate}", go_quote(name))
}

/// miekg/dns `IsDomainName` for names without backslash escapes (the character check above
/// already excludes `\`): a trailing dot is implied, `..` is invalid, a label of 64 or more
/// octets is invalid, and the wire offset (`1 + len` per label) may not exceed 256.
fn is_domain_name(name: &str) -> bool {
    if name.is_empty() {
        return false;
    }
    let fqdn: String = if name.ends_with('.') {
        name.to_string()
    } else {
        format!("{name}.")
    };
    let (mut offset, mut begin, mut was_dot) = (0usize, 0usize, false);
    for (i, byte) in fqdn.bytes().enumerate() {
        if byte != b'.' {
            was_dot = false;
            continue;
        }
        if was_dot {
            return false;
        }
        was_dot = true;
        let label_len = i - begin;
        if label_len > MAX_LABEL_OCTETS {
            return false;
        }
        offset += 1 + label_len;
        if offset > MAX_WIRE_OFFSET {
            return false;
        }
        begin = i + 1;
    }
    true
}

/// miekg/dns `SplitDomainName` for escape-free names: `"."` has no labels, otherwise one trailing
/// dot is ignored and the rest split at dots (a leading dot yields an empty first label).
fn split_domain_name(name: &str) -> Vec<&str> {
    if name == "." {
        return Vec::new();
    }
    name.strip_suffix('.').unwrap_or(name).split('.').collect()
}

/// Whether an imported `fqdn` passes the `allowed` list: an empty list allows
/// everything; otherwise some entry must equal the FQDN or be a parent domain of it, compared
/// label-wise from the right, ASCII case-insensitively, both sides made fully qualified first
/// (miekg `IsSubDomain(CanonicalName(entry), CanonicalName(fqdn))`). `"."` allows everything;
/// `other.somesome.domain` is not under `some.domain`.
pub fn fqdn_allowed(fqdn: &str, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    let child = canonical_name(fqdn);
    let child_labels = labels_of_fqdn(&child);
    allowed.iter().any(|entry| {
        let parent = canonical_name(entry);
        child_labels.ends_with(&labels_of_fqdn(&parent))
    })
}

/// miekg `CanonicalName`: ASCII-lowercase, trailing (unescaped) dot added if missing.
fn canonical_name(name: &str) -> String {
    let mut out = name.to_ascii_lowercase();
    if !is_fqdn(&out) {
        out.push('.');
    }
    out
}

/// miekg `IsFqdn`: ends with a dot that is not escaped (preceded by an even number of `\`).
fn is_fqdn(name: &str) -> bool {
    match name.strip_suffix('.') {
        Some(rest) => rest
            .bytes()
            .rev()
            .take_while(|b| *b == b'\\')
            .count()
            .is_multiple_of(2),
        None => false,
    }
}

/// Labels of a fully qualified name, splitting only at unescaped dots (miekg `Split`); the root
/// has none.
fn labels_of_fqdn(fqdn: &str) -> Vec<&str> {
    let Some(body) = fqdn.strip_suffix('.') else {
        return vec![fqdn];
    };
    if body.is_empty() {
        return Vec::new();
    }
    let bytes = body.as_bytes();
    let mut labels = Vec::new();
    let mut begin = 0;
    let mut backslashes = 0usize;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\\' => backslashes += 1,
            b'.' if backslashes.is_multiple_of(2) => {
                labels.push(&body[begin..i]);
                begin = i + 1;
                backslashes = 0;
            }
            _ => backslashes = 0,
        }
    }
    labels.push(&body[begin..]);
    labels
}

/// Go's `strconv.Quote` (the `%q` verb): double quotes, `\"` and `\\`, the C escapes
/// `\a \b \f \n \r \t \v`, `\xNN` for other control characters, printable runes kept as they
/// are, and `\uNNNN` / `\UNNNNNNNN` for runes Go does not consider printable. Unassigned code
/// points (which Go also escapes) are kept, as std has no Unicode category table.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if go_is_print(c) => out.push(c),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// Go `unicode.IsPrint` minus the unassigned-code-point check: not a control, not a space other
/// than U+0020, not a format character, not private use.
fn go_is_print(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    let cp = c as u32;
    let format_or_private = matches!(
        cp,
        0x00AD
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xE000..=0xF8FF
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
            | 0xF0000..=0x10FFFF
    );
    !format_or_private
}

#[cfg(test)]
#[path = "domains_tests.rs"]
mod tests;
