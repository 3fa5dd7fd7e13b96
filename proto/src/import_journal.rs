//! The journal a file-mode registry keeps beside each remote's imports snapshot:
//! `imports/<remote>.yaml` holds the ServiceRecords as of the last compaction and
//! `imports/<remote>.journal` one JSON line per change since then, `{"put":{..}}` or
//! `{"del":fqdn}`. The registry writes both; every reader of a remote's imports (the registry at
//! start-up, `xcc dns --feed imports`) must replay the journal over the snapshot, in order, with
//! [`Line::parse`]. One codec here so writer and readers cannot drift apart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One journal line: exactly one of `put` or `del`.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct Line {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub put: Option<Put>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub del: Option<String>,
}

/// An import added or changed: the whole imported service.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Put {
    pub fqdn: String,
    pub endpoints: Vec<Ep>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// One endpoint of a [`Put`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Ep {
    pub address: String,
    pub port: u32,
}

/// What one line of the journal changes.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Put(Put),
    Del(String),
}

impl Line {
    /// Parse one line: `Ok(None)` for a blank line; an error (the caller skips the line and says
    /// so) for a line torn by a crash mid-append or one that names neither change.
    pub fn parse(raw: &str) -> Result<Option<Change>, String> {
        if raw.trim().is_empty() {
            return Ok(None);
        }
        match serde_json::from_str::<Line>(raw).map_err(|e| e.to_string())? {
            Line { put: Some(p), .. } => Ok(Some(Change::Put(p))),
            Line { del: Some(f), .. } => Ok(Some(Change::Del(f))),
            Line { .. } => Err("a journal line with neither put nor del".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_to_changes_and_torn_lines_are_errors() {
        let put = Line {
            put: Some(Put {
                fqdn: "web.shop.example.org".into(),
                endpoints: vec![Ep {
                    address: "10.0.0.1".into(),
                    port: 443,
                }],
                annotations: BTreeMap::new(),
            }),
            del: None,
        };
        let text = serde_json::to_string(&put).expect("serialises");
        assert_eq!(
            Line::parse(&text),
            Ok(Some(Change::Put(put.put.clone().expect("put"))))
        );
        assert_eq!(
            Line::parse(r#"{"del":"web.shop.example.org"}"#),
            Ok(Some(Change::Del("web.shop.example.org".into())))
        );
        assert_eq!(Line::parse("   "), Ok(None));
        assert_eq!(
            Line::parse("{}"),
            Err("a journal line with neither put nor del".into())
        );
        assert!(Line::parse(&text[..text.len() / 2]).is_err());
    }
}
