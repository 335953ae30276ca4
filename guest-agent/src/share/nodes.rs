//! The guest's table of a share's files: FUSE node ids the kernel holds, each a name in a
//! parent directory. A node's path is found by walking its parents, so a rename moves a whole
//! subtree by changing one entry. The table lives in guest memory, which is why a share
//! keeps its open files and working directories across a migration or a restore.

use std::collections::HashMap;

pub const ROOT: u64 = 1;

struct Node {
    parent: u64,
    name: String,
    /// Lookups the kernel holds (it forgets them in `forget`).
    lookups: u64,
    /// Unlinked or replaced: its path is gone (what the kernel still holds answers ESTALE).
    gone: bool,
}

pub struct Nodes {
    map: HashMap<u64, Node>,
    names: HashMap<(u64, String), u64>,
    next: u64,
}

impl Default for Nodes {
    fn default() -> Self {
        Nodes {
            map: HashMap::new(),
            names: HashMap::new(),
            next: ROOT + 1,
        }
    }
}

impl Nodes {
    /// The path of `ino` relative to the share's root ("" for the root); `None` when the
    /// node is unknown or its file is gone.
    pub fn path(&self, ino: u64) -> Option<String> {
        let mut parts = Vec::new();
        let mut at = ino;
        while at != ROOT {
            let n = self.map.get(&at)?;
            if n.gone {
                return None;
            }
            parts.push(n.name.as_str());
            at = n.parent;
            if parts.len() > 4096 {
                return None;
            }
        }
        parts.reverse();
        Some(parts.join("/"))
    }

    /// The path of `name` in directory `parent`.
    pub fn child_path(&self, parent: u64, name: &str) -> Option<String> {
        let p = self.path(parent)?;
        Some(if p.is_empty() {
            name.to_string()
        } else {
            format!("{p}/{name}")
        })
    }

    /// The node of `name` in `parent`, made when new; one more lookup held by the kernel.
    pub fn lookup(&mut self, parent: u64, name: &str) -> u64 {
        let key = (parent, name.to_string());
        let ino = match self.names.get(&key) {
            Some(&i) => i,
            None => {
                let i = self.next;
                self.next += 1;
                self.map.insert(
                    i,
                    Node {
                        parent,
                        name: name.to_string(),
                        lookups: 0,
                        gone: false,
                    },
                );
                self.names.insert(key, i);
                i
            }
        };
        if let Some(n) = self.map.get_mut(&ino) {
            n.lookups += 1;
        }
        ino
    }

    /// The node of `name` in `parent`, if the kernel holds one (for directory listings).
    pub fn known(&self, parent: u64, name: &str) -> Option<u64> {
        self.names.get(&(parent, name.to_string())).copied()
    }

    pub fn forget(&mut self, ino: u64, n: u64) {
        let Some(node) = self.map.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 && ino != ROOT {
            let key = (node.parent, std::mem::take(&mut node.name));
            if self.names.get(&key) == Some(&ino) {
                self.names.remove(&key);
            }
            self.map.remove(&ino);
        }
    }

    /// `name` in `parent` was removed (or replaced by a rename).
    pub fn removed(&mut self, parent: u64, name: &str) {
        if let Some(ino) = self.names.remove(&(parent, name.to_string()))
            && let Some(n) = self.map.get_mut(&ino)
        {
            n.gone = true;
        }
    }

    pub fn renamed(&mut self, parent: u64, name: &str, to_parent: u64, to_name: &str) {
        self.removed(to_parent, to_name);
        if let Some(ino) = self.names.remove(&(parent, name.to_string())) {
            if let Some(n) = self.map.get_mut(&ino) {
                n.parent = to_parent;
                n.name = to_name.to_string();
            }
            self.names.insert((to_parent, to_name.to_string()), ino);
        }
    }

    /// The parent directory's node of `ino` (the root is its own).
    pub fn parent(&self, ino: u64) -> u64 {
        self.map.get(&ino).map_or(ROOT, |n| n.parent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_renames_of_directories_and_removal_makes_nodes_stale() {
        let mut t = Nodes::default();
        let d = t.lookup(ROOT, "out");
        let f = t.lookup(d, "rank0.txt");
        assert_eq!(t.path(f).as_deref(), Some("out/rank0.txt"));
        assert_eq!(t.path(ROOT).as_deref(), Some(""));
        t.renamed(ROOT, "out", ROOT, "done");
        assert_eq!(t.path(f).as_deref(), Some("done/rank0.txt"));
        let g = t.lookup(d, "old");
        t.renamed(d, "rank0.txt", d, "old");
        assert_eq!(t.path(f).as_deref(), Some("done/old"));
        assert_eq!(t.path(g), None, "the replaced file's node is stale");
        t.removed(d, "old");
        assert_eq!(t.path(f), None);
        assert_ne!(
            t.lookup(d, "old"),
            f,
            "a new file under the old name is a new node"
        );
    }

    #[test]
    fn forgotten_nodes_leave_the_table() {
        let mut t = Nodes::default();
        let a = t.lookup(ROOT, "a");
        assert_eq!(t.lookup(ROOT, "a"), a);
        t.forget(a, 1);
        assert_eq!(t.known(ROOT, "a"), Some(a));
        t.forget(a, 1);
        assert_eq!(t.known(ROOT, "a"), None);
        assert_eq!(t.path(a), None);
        t.forget(ROOT, 5);
        assert_eq!(t.path(ROOT).as_deref(), Some(""));
    }
}
