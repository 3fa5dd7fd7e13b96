//! Small helpers over `metadata` of JSON objects (read/write fields, timestamps, uids, generated
//! name suffixes) shared by the write pipelines.

use rand::Rng as _;
use serde_json::{Map, Value, json};

/// RFC 3339 UTC with seconds precision, as `metav1.Time` serialises.
pub(crate) fn now() -> String {
    let t = time::OffsetDateTime::now_utc();
    let t = t.replace_nanosecond(0).unwrap_or(t);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

/// A random RFC 4122 version-4 UUID string.
pub(crate) fn new_uid() -> String {
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Five characters from the apiserver's `generateName` alphabet (no vowels, no confusables).
pub(crate) fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// `metadata.<field>` as a string ("" when absent or not a string).
pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata`, created as an empty map if missing or not a map.
pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just set to an object"),
    }
}

/// Sets or (with `None`) removes `metadata.<field>`.
pub(crate) fn set_meta(obj: &mut Value, field: &str, value: Option<Value>) {
    let m = meta_mut(obj);
    match value {
        Some(v) => {
            m.insert(field.to_string(), v);
        }
        None => {
            m.remove(field);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_and_suffix_shapes() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, new_uid());
        let s = name_suffix();
        assert_eq!(s.len(), 5);
        assert!(
            s.bytes()
                .all(|c| b"bcdfghjklmnpqrstvwxz2456789".contains(&c))
        );
        let t = now();
        assert!(t.ends_with('Z') && t.len() == 20, "{t}");
    }
}
