//! The journal a file-mode registry keeps beside each remote's imports snapshot:
//! `imports/<remote>.yaml` holds the ServiceRecords as of the last compaction and
//! `imports/<remote>.journal` one JSON line per change since then, `{"put":{..}}` or
//! `{"del":fqdn}`. The registry writes both; every reader of a remote's imports (the registry at
//! start-up, `xcc dns --feed imports`) must replay the journal over the snapshot, in order, with
//! [`changes`]. One codec here so writer and readers cannot drift apart.
//!
//! The writer keeps zeros after the last line (it extends the file with written zeros ahead of
//! the appends, so that flushing an append writes no file-size metadata), and a crash in the
//! middle of an append can leave part of a line. So the journal ends at its first NUL byte, and
//! only lines ended by a newline count ([`end`]); what follows was never acknowledged.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why a journal line was skipped.
#[derive(Debug, Error)]
pub enum LineError {
    /// Not a JSON journal line (edited by hand, or torn).
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Valid JSON naming no change.
    #[error("a journal line with neither put nor del")]
    Empty,
}

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
    /// The cluster that exports it, when its source named one (a hierarchy answer's owner; the
    /// snapshot's `spec.origin.cluster`). Absent in lines written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Its named ports (the snapshot's `spec.ports`), as a ServiceRecord holds them. Absent when
    /// it has none, and in lines written before they existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<crate::crd::ServicePort>,
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
    /// so) for a line that is not JSON or names neither change.
    pub fn parse(raw: &[u8]) -> Result<Option<Change>, LineError> {
        if raw.trim_ascii().is_empty() {
            return Ok(None);
        }
        match serde_json::from_slice::<Line>(raw)? {
            Line { put: Some(p), .. } => Ok(Some(Change::Put(p))),
            Line { del: Some(f), .. } => Ok(Some(Change::Del(f))),
            Line { .. } => Err(LineError::Empty),
        }
    }
}

/// Length of the journal in `bytes` (a journal file's content): up to and including the last
/// newline before the first NUL byte. The writer appends there.
pub fn end(bytes: &[u8]) -> usize {
    let data = match bytes.iter().position(|b| *b == 0) {
        Some(zero) => &bytes[..zero],
        None => bytes,
    };
    data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1)
}

/// The changes of a journal file's content, in order, each with its line number (from 1). A
/// line that does not parse is an `Err`: the caller skips it and says so. The zero tail and a
/// torn last line are not lines ([`end`]).
pub fn changes(bytes: &[u8]) -> impl Iterator<Item = (usize, Result<Change, LineError>)> + '_ {
    bytes[..end(bytes)]
        .split(|b| *b == b'\n')
        .enumerate()
        .filter_map(|(n, raw)| Line::parse(raw).transpose().map(|c| (n + 1, c)))
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
                cluster: None,
                ports: vec![],
            }),
            del: None,
        };
        let parse = |raw: &[u8]| Line::parse(raw).map_err(|e| e.to_string());
        let text = serde_json::to_string(&put).expect("serialises");
        assert_eq!(
            parse(text.as_bytes()),
            Ok(Some(Change::Put(put.put.clone().expect("put"))))
        );
        assert_eq!(
            parse(br#"{"del":"web.shop.example.org"}"#),
            Ok(Some(Change::Del("web.shop.example.org".into())))
        );
        assert_eq!(parse(b"   "), Ok(None));
        assert_eq!(
            parse(b"{}"),
            Err("a journal line with neither put nor del".into())
        );
        assert!(Line::parse(&text.as_bytes()[..text.len() / 2]).is_err());
    }

    fn del(fqdn: &str) -> Change {
        Change::Del(fqdn.into())
    }

    #[test]
    fn the_journal_ends_at_its_zero_tail_or_its_last_complete_line() {
        let lines = concat!(r#"{"del":"a.x.test"}"#, "\n", r#"{"del":"b.x.test"}"#, "\n");
        let all = vec![(1, Ok(del("a.x.test"))), (2, Ok(del("b.x.test")))];
        let changes = |bytes: &[u8]| -> Vec<(usize, Result<Change, String>)> {
            changes(bytes)
                .map(|(n, c)| (n, c.map_err(|e| e.to_string())))
                .collect()
        };
        // As written: the lines, then the zeros the file was extended with.
        let mut padded = lines.as_bytes().to_vec();
        padded.extend([0u8; 100]);
        assert_eq!(end(&padded), lines.len());
        assert_eq!(changes(&padded), all);
        // Torn by a crash mid-append, with and without the zeros after it: the part is not a line.
        let mut torn = lines.as_bytes().to_vec();
        torn.extend(br#"{"del":"c.x"#);
        assert_eq!(end(&torn), lines.len());
        assert_eq!(changes(&torn), all);
        torn.extend([0u8; 10]);
        assert_eq!(changes(&torn), all);
        // A flush that reached a later block but not an earlier one: nothing after the first
        // zero counts, even a complete line.
        let mut gap = lines.as_bytes().to_vec();
        gap.extend([0u8; 10]);
        gap.extend(concat!(r#"{"del":"c.x.test"}"#, "\n").as_bytes());
        assert_eq!(end(&gap), lines.len());
        assert_eq!(changes(&gap), all);
        // A complete line that does not parse is reported with its number; the rest applies.
        let bad = format!(
            "{}{{\"put\":1}}\n\n{}",
            lines,
            r#"{"del":"c.x.test"}"#.to_owned() + "\n"
        );
        let got = changes(bad.as_bytes());
        assert_eq!(got.len(), 4);
        assert_eq!(got[..2], all[..]);
        assert_eq!(got[2].0, 3);
        assert!(got[2].1.is_err());
        assert_eq!(got[3], (5, Ok(del("c.x.test"))));
        // Empty and all-zero files hold nothing.
        assert_eq!(end(b""), 0);
        assert_eq!(changes(&[0u8; 64]).len(), 0);
    }
}
