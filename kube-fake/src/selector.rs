//! Label and field selectors from `labelSelector` / `fieldSelector` query parameters: parsed once
//! per LIST, WATCH or DELETE-collection request and matched against stored objects (and, for
//! watches, against both the new and the previous state of each event).

use serde_json::Value;

use crate::validation::{label_value_errors, qualified_name_errors};

/// A parsed label selector (conjunction of requirements).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
    Gt(String, i64),
    Lt(String, i64),
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Open,
    Close,
    Comma,
    Gt,
    Lt,
}

fn lex(s: &str) -> Vec<Tok> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '!' if chars.get(i + 1) == Some(&'=') => {
                out.push(Tok::NotEq);
                i += 2;
            }
            '!' => {
                out.push(Tok::Not);
                i += 1;
            }
            '=' if chars.get(i + 1) == Some(&'=') => {
                out.push(Tok::DoubleEq);
                i += 2;
            }
            '=' => {
                out.push(Tok::Eq);
                i += 1;
            }
            '(' => {
                out.push(Tok::Open);
                i += 1;
            }
            ')' => {
                out.push(Tok::Close);
                i += 1;
            }
            ',' => {
                out.push(Tok::Comma);
                i += 1;
            }
            '>' => {
                out.push(Tok::Gt);
                i += 1;
            }
            '<' => {
                out.push(Tok::Lt);
                i += 1;
            }
            _ => {
                let start = i;
                while i < chars.len() && !chars[i].is_whitespace() && !"!=(),<>".contains(chars[i])
                {
                    i += 1;
                }
                out.push(Tok::Ident(chars[start..i].iter().collect()));
            }
        }
    }
    out
}

fn check_key(key: &str) -> Result<(), String> {
    let errs = qualified_name_errors(key);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!("key: Invalid value: {key:?}: {}", errs.join("; ")))
    }
}

fn check_value(v: &str) -> Result<(), String> {
    let errs = label_value_errors(v);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "values[0]: Invalid value: {v:?}: {}",
            errs.join("; ")
        ))
    }
}

impl LabelSelector {
    /// Parses the Kubernetes selector syntax (`a=b,c!=d,e in (f,g),!h,i`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let toks = lex(s);
        let mut reqs = Vec::new();
        let mut i = 0;
        let ident = |i: usize| match toks.get(i) {
            Some(Tok::Ident(s)) => Some(s.clone()),
            _ => None,
        };
        while i < toks.len() {
            let req = if toks[i] == Tok::Not {
                let key = ident(i + 1).ok_or("found '!', expected: identifier")?;
                check_key(&key)?;
                i += 2;
                Requirement::DoesNotExist(key)
            } else {
                let key = ident(i)
                    .ok_or_else(|| format!("found {:?}, expected: !, identifier", toks[i]))?;
                check_key(&key)?;
                i += 1;
                match toks.get(i) {
                    None | Some(Tok::Comma) => Requirement::Exists(key),
                    Some(op @ (Tok::Eq | Tok::DoubleEq | Tok::NotEq)) => {
                        let op = op.clone();
                        i += 1;
                        let value = match toks.get(i) {
                            Some(Tok::Ident(v)) => {
                                i += 1;
                                v.clone()
                            }
                            None | Some(Tok::Comma) => String::new(),
                            Some(t) => return Err(format!("found {t:?}, expected: identifier")),
                        };
                        check_value(&value)?;
                        if op == Tok::NotEq {
                            Requirement::NotEq(key, value)
                        } else {
                            Requirement::Eq(key, value)
                        }
                    }
                    Some(Tok::Ident(w)) if w == "in" || w == "notin" => {
                        let neg = w == "notin";
                        i += 1;
                        if toks.get(i) != Some(&Tok::Open) {
                            return Err("expected '(' after in/notin".into());
                        }
                        i += 1;
                        let mut values = Vec::new();
                        loop {
                            match toks.get(i) {
                                Some(Tok::Ident(v)) => {
                                    check_value(v)?;
                                    values.push(v.clone());
                                    i += 1;
                                }
                                Some(Tok::Close) => {
                                    i += 1;
                                    break;
                                }
                                _ => return Err("expected identifier or ')' in value set".into()),
                            }
                            match toks.get(i) {
                                Some(Tok::Comma) => i += 1,
                                Some(Tok::Close) => {
                                    i += 1;
                                    break;
                                }
                                _ => return Err("expected ',' or ')' in value set".into()),
                            }
                        }
                        if values.is_empty() {
                            return Err(
                                "for 'in', 'notin' operators, values set can't be empty".into()
                            );
                        }
                        if neg {
                            Requirement::NotIn(key, values)
                        } else {
                            Requirement::In(key, values)
                        }
                    }
                    Some(op @ (Tok::Gt | Tok::Lt)) => {
                        let gt = *op == Tok::Gt;
                        i += 1;
                        let n = ident(i)
                            .and_then(|v| v.parse::<i64>().ok())
                            .ok_or("for 'Gt', 'Lt' operators, the value must be an integer")?;
                        i += 1;
                        if gt {
                            Requirement::Gt(key, n)
                        } else {
                            Requirement::Lt(key, n)
                        }
                    }
                    Some(t) => {
                        return Err(format!(
                            "found {t:?}, expected: in, notin, =, ==, !=, gt, lt"
                        ));
                    }
                }
            };
            reqs.push(req);
            match toks.get(i) {
                None => break,
                Some(Tok::Comma) => {
                    i += 1;
                    if i == toks.len() {
                        return Err("found end of string, expected: !, identifier".into());
                    }
                }
                Some(t) => return Err(format!("found {t:?}, expected: ','")),
            }
        }
        Ok(Self { reqs })
    }

    /// Whether `obj`'s `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
            Requirement::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            Requirement::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }
}

/// A parsed field selector: `(field, value, negated)` terms, all of which must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct FieldSelector {
    terms: Vec<(String, String, bool)>,
}

/// Splits on unescaped `sep`, keeping escapes for the caller.
fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            if let Some(last) = out.last_mut() {
                last.push('\\');
                last.push(c);
            }
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(String::new());
        } else if let Some(last) = out.last_mut() {
            last.push(c);
        }
    }
    out
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => return Err(format!("invalid escape sequence \\{e}")),
                None => return Err("unterminated escape sequence".into()),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

impl FieldSelector {
    /// Parses `a=b,c!=d`; every field must be in `supported` (else the real server's
    /// `field label not supported` error).
    pub fn parse(s: &str, supported: &[&str]) -> Result<Self, String> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self { terms });
        }
        for part in split_unescaped(s, ',') {
            let (field, value, neg) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, false)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            let field = field.trim().to_string();
            if !supported.contains(&field.as_str()) {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field, unescape(value)?, neg));
        }
        Ok(Self { terms })
    }

    /// Whether every term holds for `obj`.
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(f, v, neg)| {
            let actual = field_value(obj, f);
            (actual == *v) != *neg
        })
    }
}

/// The string form of a selectable field (missing fields read as empty, booleans and numbers in
/// their JSON form, as the apiserver's field sets do).
fn field_value(obj: &Value, field: &str) -> String {
    let pointer = format!("/{}", field.replace('.', "/"));
    match obj.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Object(o)) if field == "source" => o
            .get("component")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_selector_operators() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (db, web)", true),
            ("app notin (db,web)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web,tier=back", false),
            ("app=web, tier=front", true),
            ("n>4", true),
            ("n<5", false),
            ("example.com/role=x", false),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&o), want, "{sel}");
        }
        assert!(LabelSelector::parse("").unwrap().matches(&json!({})));
    }

    #[test]
    fn label_selector_rejects_garbage() {
        for bad in [
            "=x",
            "a in ()",
            "a in (b",
            "a,",
            "Bad Key=x",
            "a=b c",
            "a=-bad-",
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad} should not parse");
        }
        // An empty value is legal and matches an empty label value.
        assert!(
            LabelSelector::parse("app=")
                .unwrap()
                .matches(&obj(json!({"app": ""})))
        );
    }

    #[test]
    fn field_selector_names_and_escapes() {
        let supported = ["metadata.name", "metadata.namespace"];
        let o = obj(json!({}));
        assert!(
            FieldSelector::parse("metadata.name=a", &supported)
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("metadata.name!=a", &supported)
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("metadata.name==a,metadata.namespace=ns", &supported)
                .unwrap()
                .matches(&o)
        );
        assert_eq!(
            FieldSelector::parse("spec.nodeName=x", &supported),
            Err("field label not supported: spec.nodeName".into())
        );
        let comma = json!({"metadata": {"name": "a,b"}});
        assert!(
            FieldSelector::parse("metadata.name=a\\,b", &supported)
                .unwrap()
                .matches(&comma)
        );
    }
}
