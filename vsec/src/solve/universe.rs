//! The set of candidate packages the solver chooses from.

use crate::deb::Arch;
use crate::index::{Package, PackagesIndex};
use std::collections::HashMap;

pub type PkgId = u32;

/// Names to package ids.
pub(super) type NameMap = HashMap<String, Vec<PkgId>>;

/// What the solver needs to know about the repository. Implementations do no I/O during
/// solving.
pub trait Provider {
    fn package(&self, id: PkgId) -> &Package;
    /// Real packages of this name, best first (highest version, then earliest repository).
    fn by_name(&self, name: &str) -> &[PkgId];
    /// Packages that `Provides:` this name, in index order.
    fn providers(&self, name: &str) -> &[PkgId];
}

/// A [`Provider`] the resolver can also enumerate: what a request needs beyond the solver
/// (the base set, did-you-mean names), answered without walking every package.
pub trait Catalog: Provider + Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Every real or virtual name, for did-you-mean suggestions.
    fn names(&self) -> Vec<&str>;
    /// Essential packages and those of priority standard or higher: every base variant's
    /// set is a subset.
    fn base_candidates(&self) -> Vec<PkgId>;
    /// Damage found while answering (a cache record that failed its checksum). Anything
    /// computed from this catalog since is void; `None` for in-memory universes.
    fn fault(&self) -> Option<String> {
        None
    }
    /// The universe parsed from the indices, when this catalog is one (not a cache file).
    fn parsed(&self) -> Option<&Universe> {
        None
    }
}

/// An in-memory [`Provider`] over parsed indices, restricted to one architecture plus `all`.
#[derive(Debug, Default)]
pub struct Universe {
    packages: Vec<Package>,
    by_name: HashMap<String, Vec<PkgId>>,
    providers: HashMap<String, Vec<PkgId>>,
}

impl Universe {
    /// Packages of other architectures are dropped; the same (name, version, architecture)
    /// in several repositories is kept once, from the first repository.
    pub fn new(index: PackagesIndex, arch: &Arch) -> Universe {
        let mut u = Universe::default();
        for p in index.packages {
            if p.architecture != *arch && p.architecture.as_str() != "all" {
                continue;
            }
            let ids = u.by_name.entry(p.name.as_str().to_string()).or_default();
            if ids.iter().any(|&i| {
                let q = &u.packages[i as usize];
                q.version == p.version && q.architecture == p.architecture
            }) {
                continue;
            }
            let id = u.packages.len() as PkgId;
            ids.push(id);
            for prov in &p.provides {
                u.providers
                    .entry(prov.name.as_str().to_string())
                    .or_default()
                    .push(id);
            }
            u.packages.push(p);
        }
        let pk = &u.packages;
        for ids in u.by_name.values_mut() {
            ids.sort_by(|&a, &b| {
                let (pa, pb) = (&pk[a as usize], &pk[b as usize]);
                pb.version.cmp(&pa.version).then(a.cmp(&b))
            });
        }
        u
    }

    pub fn len(&self) -> usize {
        self.packages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packages.is_empty()
    }

    pub fn packages(&self) -> &[Package] {
        &self.packages
    }

    /// Every real or virtual name, for did-you-mean suggestions.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name
            .keys()
            .chain(self.providers.keys())
            .map(String::as_str)
    }

    /// The name tables, for writing the cache file.
    pub(super) fn maps(&self) -> (&NameMap, &NameMap) {
        (&self.by_name, &self.providers)
    }
}

impl Catalog for Universe {
    fn len(&self) -> usize {
        self.packages.len()
    }
    fn parsed(&self) -> Option<&Universe> {
        Some(self)
    }
    fn names(&self) -> Vec<&str> {
        Universe::names(self).collect()
    }
    fn base_candidates(&self) -> Vec<PkgId> {
        (0..self.packages.len() as PkgId)
            .filter(|&i| {
                let p = &self.packages[i as usize];
                p.essential || p.priority <= crate::index::Priority::Standard
            })
            .collect()
    }
}

impl Provider for Universe {
    fn package(&self, id: PkgId) -> &Package {
        &self.packages[id as usize]
    }
    fn by_name(&self, name: &str) -> &[PkgId] {
        self.by_name.get(name).map_or(&[], Vec::as_slice)
    }
    fn providers(&self, name: &str) -> &[PkgId] {
        self.providers.get(name).map_or(&[], Vec::as_slice)
    }
}
