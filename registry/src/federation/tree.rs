//! The shape of the hierarchy as one level sees it: this cluster, its ancestors (as its parent
//! reported them) and, per direct child, every cluster in that child's subtree. Pure.
//!
//! It answers the two questions the protocol needs: may this child speak for that cluster
//! (spoofing), and which way is a cluster (routing down). It refuses a subtree that would put a
//! cluster under two children, or that contains this cluster or one of its ancestors (a cycle),
//! with an error naming the conflict.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("cycle: {path}")]
    Cycle { path: String },
    #[error(
        "cluster {cluster:?} is already in the subtree of child {existing:?}; {child:?} cannot claim it"
    )]
    ClaimedTwice {
        cluster: String,
        existing: String,
        child: String,
    },
    #[error("child {child:?} must list itself in its subtree")]
    MissingSelf { child: String },
    #[error("cluster {cluster:?} is not in the subtree of child {child:?}")]
    NotInSubtree { cluster: String, child: String },
}

/// Where a message for a cluster goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direction {
    Local,
    Child(String),
    /// Not below us: only the parent can know.
    Up,
}

#[derive(Debug, Clone, Default)]
pub struct Tree {
    cluster: String,
    /// Root first, parent last, as the parent reported it.
    ancestors: Vec<String>,
    children: BTreeMap<String, BTreeSet<String>>,
}

impl Tree {
    pub fn new(cluster: impl Into<String>) -> Self {
        Self {
            cluster: cluster.into(),
            ancestors: vec![],
            children: BTreeMap::new(),
        }
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    pub fn ancestors(&self) -> &[String] {
        &self.ancestors
    }

    /// Record the path above us (root first, parent last). Fails if it contains us or any
    /// cluster of our subtree: then our parent is below us.
    pub fn set_ancestors(&mut self, ancestors: Vec<String>) -> Result<(), TreeError> {
        let subtree = self.subtree();
        if let Some(hit) = ancestors.iter().find(|a| subtree.contains(*a)) {
            let mut path = ancestors.clone();
            path.push(self.cluster.clone());
            path.push(hit.clone());
            return Err(TreeError::Cycle {
                path: path.join(" → "),
            });
        }
        self.ancestors = ancestors;
        Ok(())
    }

    /// Replace what `child` claims as its subtree.
    pub fn set_child_subtree(
        &mut self,
        child: &str,
        clusters: BTreeSet<String>,
    ) -> Result<(), TreeError> {
        if !clusters.contains(child) {
            return Err(TreeError::MissingSelf {
                child: child.to_string(),
            });
        }
        if clusters.contains(&self.cluster) {
            return Err(TreeError::Cycle {
                path: format!("{} → {child} → … → {}", self.cluster, self.cluster),
            });
        }
        if let Some(a) = self.ancestors.iter().find(|a| clusters.contains(*a)) {
            let mut path = self.ancestors.clone();
            path.push(self.cluster.clone());
            path.push(child.to_string());
            path.push(a.clone());
            return Err(TreeError::Cycle {
                path: path.join(" → "),
            });
        }
        for (other, set) in &self.children {
            if other == child {
                continue;
            }
            if let Some(c) = clusters.iter().find(|c| set.contains(*c)) {
                return Err(TreeError::ClaimedTwice {
                    cluster: c.clone(),
                    existing: other.clone(),
                    child: child.to_string(),
                });
            }
        }
        self.children.insert(child.to_string(), clusters);
        Ok(())
    }

    pub fn remove_child(&mut self, child: &str) -> Option<BTreeSet<String>> {
        self.children.remove(child)
    }

    pub fn children(&self) -> &BTreeMap<String, BTreeSet<String>> {
        &self.children
    }

    /// This cluster and every cluster below it.
    pub fn subtree(&self) -> BTreeSet<String> {
        let mut all: BTreeSet<String> = self.children.values().flatten().cloned().collect();
        all.insert(self.cluster.clone());
        all
    }

    /// May `child` speak for `cluster`?
    pub fn check_claim(&self, child: &str, cluster: &str) -> Result<(), TreeError> {
        match self.children.get(child) {
            Some(set) if set.contains(cluster) => Ok(()),
            _ => Err(TreeError::NotInSubtree {
                cluster: cluster.to_string(),
                child: child.to_string(),
            }),
        }
    }

    pub fn direction(&self, cluster: &str) -> Direction {
        if cluster == self.cluster {
            return Direction::Local;
        }
        for (child, set) in &self.children {
            if set.contains(cluster) {
                return Direction::Child(child.clone());
            }
        }
        Direction::Up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn subtree_routing_and_claims() {
        let mut t = Tree::new("root");
        t.set_child_subtree("b", set(&["b", "b1", "b2"]))
            .expect("ok");
        t.set_child_subtree("c", set(&["c", "c1"])).expect("ok");
        assert_eq!(t.subtree(), set(&["root", "b", "b1", "b2", "c", "c1"]));
        assert_eq!(t.direction("b2"), Direction::Child("b".into()));
        assert_eq!(t.direction("c"), Direction::Child("c".into()));
        assert_eq!(t.direction("root"), Direction::Local);
        assert_eq!(t.direction("elsewhere"), Direction::Up);
        assert!(t.check_claim("b", "b1").is_ok());
        assert_eq!(
            t.check_claim("c", "b1"),
            Err(TreeError::NotInSubtree {
                cluster: "b1".into(),
                child: "c".into()
            })
        );
        // A child may shrink or grow its own subtree.
        t.set_child_subtree("b", set(&["b", "b1"])).expect("ok");
        assert_eq!(t.direction("b2"), Direction::Up);
        t.remove_child("c");
        assert_eq!(t.direction("c1"), Direction::Up);
    }

    #[test]
    fn a_cluster_in_two_subtrees_is_refused_naming_both() {
        let mut t = Tree::new("root");
        t.set_child_subtree("b", set(&["b", "x"])).expect("ok");
        let err = t
            .set_child_subtree("c", set(&["c", "x"]))
            .expect_err("claimed twice");
        assert_eq!(
            err.to_string(),
            "cluster \"x\" is already in the subtree of child \"b\"; \"c\" cannot claim it"
        );
        // The refused claim changed nothing.
        assert_eq!(t.direction("x"), Direction::Child("b".into()));
        assert!(!t.children().contains_key("c"));
    }

    #[test]
    fn cycles_are_refused_naming_the_path() {
        let mut t = Tree::new("b");
        t.set_ancestors(vec!["root".into()]).expect("ok");
        let err = t
            .set_child_subtree("b1", set(&["b1", "root"]))
            .expect_err("cycle");
        assert_eq!(err.to_string(), "cycle: root → b → b1 → root");
        let err = t
            .set_child_subtree("b1", set(&["b1", "b"]))
            .expect_err("cycle");
        assert_eq!(err.to_string(), "cycle: b → b1 → … → b");
        t.set_child_subtree("b1", set(&["b1"])).expect("ok");
        let err = t
            .set_ancestors(vec!["root".into(), "b1".into()])
            .expect_err("parent below us");
        assert_eq!(err.to_string(), "cycle: root → b1 → b → b1");
        assert_eq!(
            t.set_child_subtree("b2", set(&["x"])),
            Err(TreeError::MissingSelf { child: "b2".into() })
        );
    }
}
