//! The backtracking search. See the module documentation of `solve` for the strategy.

use super::explain::{Failure, Rejection, Unsatisfiable};
use super::universe::{PkgId, Provider};
use crate::deb::{Alternatives, ArchQualifier, PackagePattern, Relation};
use crate::index::Package;
use std::collections::HashMap;

/// A top-level requirement: a group of alternatives and a label for messages.
#[derive(Debug, Clone)]
pub struct Root {
    pub group: Alternatives,
    /// e.g. `requested`, `policy site.yaml`, `essential`.
    pub label: String,
}

/// Why a package is in the solution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parent {
    Root(usize),
    Package(PkgId),
}

#[derive(Debug, Clone, Default)]
pub struct SolveOptions {
    /// Install Recommends where they can be satisfied (never a reason to fail).
    pub recommends: bool,
    /// Packages that must never be chosen, with where the pattern comes from.
    pub forbidden: Vec<(PackagePattern, String)>,
    /// Upper bound on installs tried, so a pathological request ends with an error.
    pub max_steps: u64,
}

#[derive(Debug, Clone)]
pub struct Solution {
    /// Chosen packages in the order they were chosen, each with why.
    pub chosen: Vec<(PkgId, Parent)>,
    /// Installs tried, including those undone by backtracking.
    pub steps: u64,
    pub backtracks: u64,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum SolveError {
    #[error(transparent)]
    Unsatisfiable(#[from] Box<Unsatisfiable>),
    #[error(
        "the search gave up after {steps} steps without a solution; simplify the request or pin versions"
    )]
    SearchLimit { steps: u64 },
}

#[derive(Clone, Copy)]
struct Obligation<'a> {
    group: &'a Alternatives,
    from: Parent,
    soft: bool,
}

struct ChoicePoint<'a> {
    trail_len: usize,
    root_pos: usize,
    root_deps_pending: bool,
    stack: Vec<Obligation<'a>>,
    options: Vec<Option<PkgId>>,
    next: usize,
    ob: Obligation<'a>,
}

struct State<'a, P: Provider + ?Sized> {
    p: &'a P,
    opts: &'a SolveOptions,
    roots: &'a [Root],
    chosen_by_name: HashMap<&'a str, PkgId>,
    parent: HashMap<PkgId, Parent>,
    /// Installed packages' provided names → who provides them (LIFO, undone with the trail).
    provided: HashMap<&'a str, Vec<PkgId>>,
    /// Conflicts/Breaks of installed packages, by target name (LIFO).
    negative: HashMap<&'a str, Vec<(PkgId, &'a Relation)>>,
    trail: Vec<PkgId>,
    /// Roots are all chosen first, then their dependencies are followed: apt marks every
    /// package of the command line before it installs dependencies.
    root_pos: usize,
    root_deps_pending: bool,
    stack: Vec<Obligation<'a>>,
    steps: u64,
    backtracks: u64,
    best: Option<Failure>,
}

/// Solves `roots` against `provider`.
pub fn solve<P: Provider + ?Sized>(
    provider: &P,
    roots: &[Root],
    opts: &SolveOptions,
) -> Result<Solution, SolveError> {
    let mut st = State {
        p: provider,
        opts,
        roots,
        chosen_by_name: HashMap::new(),
        parent: HashMap::new(),
        provided: HashMap::new(),
        negative: HashMap::new(),
        trail: Vec::new(),
        root_pos: 0,
        root_deps_pending: true,
        stack: Vec::new(),
        steps: 0,
        backtracks: 0,
        best: None,
    };
    let max = if opts.max_steps == 0 {
        2_000_000
    } else {
        opts.max_steps
    };
    let mut choices: Vec<ChoicePoint<'_>> = Vec::new();
    loop {
        let ob = if st.root_pos < roots.len() {
            st.root_pos += 1;
            Obligation {
                group: &roots[st.root_pos - 1].group,
                from: Parent::Root(st.root_pos - 1),
                soft: false,
            }
        } else if st.root_deps_pending {
            st.root_deps_pending = false;
            for &id in st.trail.clone().iter().rev() {
                st.push_deps(id);
            }
            continue;
        } else {
            match st.stack.pop() {
                Some(ob) => ob,
                None => break,
            }
        };
        if st.satisfied(ob.group) {
            continue;
        }
        let (options, rejected) = st.options(ob);
        if options.is_empty() {
            st.record_failure(ob, rejected);
            if !st.backtrack(&mut choices) {
                let failure = st.best.take().expect("a failure was just recorded");
                return Err(Box::new(failure.into_unsat()).into());
            }
        } else {
            let first = options[0];
            // A single option is no choice: backtracking past it undoes it anyway.
            if options.len() > 1 {
                choices.push(ChoicePoint {
                    trail_len: st.trail.len(),
                    root_pos: st.root_pos,
                    root_deps_pending: st.root_deps_pending,
                    stack: st.stack.clone(),
                    options,
                    next: 1,
                    ob,
                });
            }
            if let Some(id) = first {
                st.install(id, ob.from);
            }
        }
        if st.steps > max {
            return Err(SolveError::SearchLimit { steps: st.steps });
        }
    }
    let chosen = st.trail.iter().map(|&id| (id, st.parent[&id])).collect();
    Ok(Solution {
        chosen,
        steps: st.steps,
        backtracks: st.backtracks,
    })
}

fn relation_matches_real(r: &Relation, pkg: &Package) -> bool {
    pkg.name == r.name
        && r.constraint
            .as_ref()
            .is_none_or(|c| c.matches(&pkg.version))
}

/// Does `pkg` provide `r` (Debian Policy §7.5: a versioned relation needs a versioned
/// provide)?
fn relation_matches_provide(r: &Relation, pkg: &Package) -> bool {
    pkg.provides.iter().any(|pv| {
        pv.name == r.name
            && match (&r.constraint, &pv.constraint) {
                (None, _) => true,
                (Some(c), Some(pc)) => c.matches(&pc.version),
                (Some(_), None) => false,
            }
    })
}

/// A foreign-architecture qualifier can never be met by a single-architecture universe.
fn arch_ok(r: &Relation) -> bool {
    !matches!(r.arch_qualifier, Some(ArchQualifier::Arch(_)))
}

impl<'a, P: Provider + ?Sized> State<'a, P> {
    fn satisfied(&self, group: &Alternatives) -> bool {
        group.iter().filter(|r| arch_ok(r)).any(|r| {
            self.chosen_by_name
                .get(r.name.as_str())
                .is_some_and(|&id| relation_matches_real(r, self.p.package(id)))
                || self.provided.get(r.name.as_str()).is_some_and(|ids| {
                    ids.iter()
                        .any(|&id| relation_matches_provide(r, self.p.package(id)))
                })
        })
    }

    fn forbidden(&self, pkg: &Package) -> Option<String> {
        self.opts
            .forbidden
            .iter()
            .find(|(pat, _)| pat.matches(&pkg.name, &pkg.version))
            .map(|(pat, origin)| format!("`{pat}` forbidden by {origin}"))
    }

    /// Candidates for a group in apt's preference order, and why others were rejected.
    fn options(&self, ob: Obligation<'a>) -> (Vec<Option<PkgId>>, Vec<(PkgId, Rejection)>) {
        let mut out: Vec<Option<PkgId>> = Vec::new();
        let mut rejected = Vec::new();
        for r in ob.group.iter().filter(|r| arch_ok(r)) {
            let real = self
                .p
                .by_name(r.name.as_str())
                .iter()
                .copied()
                .filter(|&id| relation_matches_real(r, self.p.package(id)));
            let mut provs: Vec<PkgId> = self
                .p
                .providers(r.name.as_str())
                .iter()
                .copied()
                .filter(|&id| relation_matches_provide(r, self.p.package(id)))
                .collect();
            provs.sort_by_key(|&id| (self.p.package(id).priority, id));
            for id in real.chain(provs) {
                if out.contains(&Some(id)) || rejected.iter().any(|(x, _)| *x == id) {
                    continue;
                }
                match self.reject(id) {
                    None => out.push(Some(id)),
                    Some(why) => rejected.push((id, why)),
                }
            }
        }
        if ob.soft {
            out.push(None);
        }
        (out, rejected)
    }

    fn reject(&self, id: PkgId) -> Option<Rejection> {
        let pkg = self.p.package(id);
        if let Some(f) = self.forbidden(pkg) {
            return Some(Rejection::Forbidden(f));
        }
        if let Some(&other) = self.chosen_by_name.get(pkg.name.as_str()) {
            return Some(Rejection::OtherVersionChosen(self.describe(other)));
        }
        // Conflicts/Breaks of installed packages against this one (by name or provide).
        let names =
            std::iter::once(pkg.name.as_str()).chain(pkg.provides.iter().map(|r| r.name.as_str()));
        for n in names {
            for &(by, rel) in self.negative.get(n).into_iter().flatten() {
                if by != id
                    && (relation_matches_real(rel, pkg) || relation_matches_provide(rel, pkg))
                {
                    return Some(Rejection::ConflictedBy(self.describe(by), rel.to_string()));
                }
            }
        }
        // This package's Conflicts/Breaks against installed ones.
        for rel in pkg.conflicts.iter().chain(&pkg.breaks).flatten() {
            let hit = self
                .chosen_by_name
                .get(rel.name.as_str())
                .copied()
                .filter(|&o| relation_matches_real(rel, self.p.package(o)))
                .or_else(|| {
                    self.provided.get(rel.name.as_str()).and_then(|ids| {
                        ids.iter()
                            .copied()
                            .find(|&o| relation_matches_provide(rel, self.p.package(o)))
                    })
                });
            if let Some(o) = hit.filter(|&o| o != id) {
                return Some(Rejection::ConflictsWith(rel.to_string(), self.describe(o)));
            }
        }
        // One step of lookahead: a dependency nothing in the universe can satisfy.
        for group in pkg.pre_depends.iter().chain(&pkg.depends) {
            if !group
                .iter()
                .filter(|r| arch_ok(r))
                .any(|r| self.exists(r, true))
            {
                let g: Vec<String> = group.iter().map(|r| r.to_string()).collect();
                let g = g.join(" | ");
                let forbidden = group
                    .iter()
                    .filter(|r| arch_ok(r))
                    .flat_map(|r| {
                        self.p
                            .by_name(r.name.as_str())
                            .iter()
                            .chain(self.p.providers(r.name.as_str()))
                    })
                    .find_map(|&c| self.forbidden(self.p.package(c)));
                return Some(match forbidden {
                    Some(f) => Rejection::Forbidden(format!(
                        "its dependency `{g}` is only met by forbidden packages: {f}"
                    )),
                    None => Rejection::MissingDependency(g),
                });
            }
        }
        None
    }

    fn exists(&self, r: &Relation, allowed_only: bool) -> bool {
        let ok = |&id: &PkgId| !allowed_only || self.forbidden(self.p.package(id)).is_none();
        self.p
            .by_name(r.name.as_str())
            .iter()
            .filter(|&&id| relation_matches_real(r, self.p.package(id)))
            .any(ok)
            || self
                .p
                .providers(r.name.as_str())
                .iter()
                .filter(|&&id| relation_matches_provide(r, self.p.package(id)))
                .any(ok)
    }

    fn install(&mut self, id: PkgId, from: Parent) {
        let p: &'a P = self.p;
        let pkg = p.package(id);
        self.steps += 1;
        self.chosen_by_name.insert(pkg.name.as_str(), id);
        self.parent.insert(id, from);
        for pv in &pkg.provides {
            self.provided.entry(pv.name.as_str()).or_default().push(id);
        }
        for rel in pkg.conflicts.iter().chain(&pkg.breaks).flatten() {
            self.negative
                .entry(rel.name.as_str())
                .or_default()
                .push((id, rel));
        }
        self.trail.push(id);
        if !matches!(from, Parent::Root(_)) {
            self.push_deps(id);
        }
    }

    fn push_deps(&mut self, id: PkgId) {
        let p: &'a P = self.p;
        let pkg = p.package(id);
        // Pushed in reverse so the first dependency is handled first, as apt does.
        if self.opts.recommends {
            for g in pkg.recommends.iter().rev() {
                self.stack.push(Obligation {
                    group: g,
                    from: Parent::Package(id),
                    soft: true,
                });
            }
        }
        for g in pkg.depends.iter().rev().chain(pkg.pre_depends.iter().rev()) {
            self.stack.push(Obligation {
                group: g,
                from: Parent::Package(id),
                soft: false,
            });
        }
    }

    fn uninstall_last(&mut self) {
        let p: &'a P = self.p;
        let id = self.trail.pop().expect("trail not empty");
        let pkg = p.package(id);
        self.chosen_by_name.remove(pkg.name.as_str());
        self.parent.remove(&id);
        for pv in &pkg.provides {
            if let Some(v) = self.provided.get_mut(pv.name.as_str()) {
                v.pop();
            }
        }
        for rel in pkg.conflicts.iter().chain(&pkg.breaks).flatten() {
            if let Some(v) = self.negative.get_mut(rel.name.as_str()) {
                v.pop();
            }
        }
    }

    /// Undoes to the latest choice point with an option left and takes it. False when
    /// every choice is exhausted.
    fn backtrack(&mut self, choices: &mut Vec<ChoicePoint<'a>>) -> bool {
        self.backtracks += 1;
        while let Some(cp) = choices.last_mut() {
            while self.trail.len() > cp.trail_len {
                self.uninstall_last();
            }
            while cp.next < cp.options.len() {
                let opt = cp.options[cp.next];
                cp.next += 1;
                match opt {
                    None => {
                        self.stack = cp.stack.clone();
                        self.root_pos = cp.root_pos;
                        self.root_deps_pending = cp.root_deps_pending;
                        return true;
                    }
                    Some(id) if self.reject(id).is_none() => {
                        self.stack = cp.stack.clone();
                        self.root_pos = cp.root_pos;
                        self.root_deps_pending = cp.root_deps_pending;
                        let from = cp.ob.from;
                        self.install(id, from);
                        return true;
                    }
                    Some(_) => {}
                }
            }
            choices.pop();
        }
        false
    }

    pub(super) fn describe(&self, id: PkgId) -> String {
        let pkg = self.p.package(id);
        let mut s = format!("{} {}", pkg.name, pkg.version);
        let mut cur = self.parent.get(&id).copied();
        let mut depth = 0;
        while let Some(par) = cur {
            match par {
                Parent::Root(i) => {
                    s.push_str(&format!(" ({})", self.roots[i].label));
                    break;
                }
                Parent::Package(q) => {
                    let qp = self.p.package(q);
                    s.push_str(&format!(" <- {} {}", qp.name, qp.version));
                    cur = self.parent.get(&q).copied();
                }
            }
            depth += 1;
            if depth > 64 {
                break;
            }
        }
        s
    }

    fn record_failure(&mut self, ob: Obligation<'a>, rejected: Vec<(PkgId, Rejection)>) {
        // The deepest dead end is the most informative one.
        if self
            .best
            .as_ref()
            .is_some_and(|b| b.depth > self.trail.len())
        {
            return;
        }
        let needed_by = match ob.from {
            Parent::Root(i) => self.roots[i].label.clone(),
            Parent::Package(id) => self.describe(id),
        };
        let group: Vec<String> = ob.group.iter().map(|r| r.to_string()).collect();
        self.best = Some(Failure {
            depth: self.trail.len(),
            group: group.join(" | "),
            needed_by,
            rejected: rejected
                .into_iter()
                .map(|(id, why)| {
                    let p = self.p.package(id);
                    (format!("{} {}", p.name, p.version), why)
                })
                .collect(),
        });
    }
}
