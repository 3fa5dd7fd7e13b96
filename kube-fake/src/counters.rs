//! Request accounting for tests: every request is counted per (resource, verb) when it arrives;
//! mutating requests that actually changed stored state are counted again as writes. Resources
//! are named `plural[.group][/status]`, e.g. `services`, `services/status`,
//! `endpointslices.discovery.k8s.io`. Server-internal changes (garbage collection, namespace
//! cleanup) are not requests and are not counted.

use std::collections::BTreeMap;
use std::fmt;

/// The API verb of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH (any patch type, including server-side apply).
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
}

impl Verb {
    /// Whether the verb mutates (POST/PUT/PATCH/DELETE).
    pub fn is_mutating(self) -> bool {
        !matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        })
    }
}

/// A snapshot of counts per (resource, verb).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts(BTreeMap<(String, Verb), u64>);

impl Counts {
    pub(crate) fn add(&mut self, resource: &str, verb: Verb) {
        *self.0.entry((resource.to_string(), verb)).or_default() += 1;
    }
    /// Sum over all resources and verbs.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
    /// Count for one resource and verb (0 if none).
    pub fn get(&self, resource: &str, verb: Verb) -> u64 {
        self.0
            .get(&(resource.to_string(), verb))
            .copied()
            .unwrap_or_default()
    }
    /// Sum over all verbs for one resource.
    pub fn for_resource(&self, resource: &str) -> u64 {
        self.0
            .iter()
            .filter(|((r, _), _)| r == resource)
            .map(|(_, n)| n)
            .sum()
    }
    /// Sum over all resources for one verb.
    pub fn for_verb(&self, verb: Verb) -> u64 {
        self.0
            .iter()
            .filter(|((_, v), _)| *v == verb)
            .map(|(_, n)| n)
            .sum()
    }
    /// All non-zero counts, ordered by resource then verb.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Verb, u64)> + '_ {
        self.0.iter().map(|((r, v), n)| (r.as_str(), *v, *n))
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .iter()
            .map(|(r, v, n)| format!("{v} {r}: {n}"))
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// All counters kept by the server.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub reads: Counts,
    pub requests: Counts,
    pub writes: Counts,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums() {
        let mut c = Counts::default();
        c.add("services", Verb::Create);
        c.add("services", Verb::Create);
        c.add("services/status", Verb::Update);
        assert_eq!(c.total(), 3);
        assert_eq!(c.get("services", Verb::Create), 2);
        assert_eq!(c.for_resource("services"), 2);
        assert_eq!(c.for_verb(Verb::Update), 1);
        assert_eq!(
            c.to_string(),
            "create services: 2, update services/status: 1"
        );
    }
}
