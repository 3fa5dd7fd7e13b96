//! Write accounting for tests: mutating requests that actually changed stored state are counted
//! per (resource, verb). Resources are named `plural[.group][/status]`, e.g. `services`,
//! `services/status`, `endpointslices.discovery.k8s.io`.

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
        assert_eq!(
            c.to_string(),
            "create services: 2, update services/status: 1"
        );
    }
}
