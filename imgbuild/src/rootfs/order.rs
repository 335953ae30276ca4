//! The order preinst scripts run in: a package's Pre-Depends first (dpkg's rule).

use super::Unpacked;
use std::collections::{BTreeMap, BTreeSet};

/// Names in a relationship field, first alternative of each group (`a (>= 1) | b, c:any`).
fn related(field: Option<&str>) -> Vec<String> {
    field
        .unwrap_or("")
        .split(',')
        .filter_map(|group| {
            let first = group.split('|').next()?.trim();
            let name = first.split([' ', '(', ':', '[']).next()?.trim();
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// Depth-first order over Pre-Depends; cycles (rare, and dpkg breaks them too) are cut.
pub fn pre_depends_order(pkgs: &[Unpacked]) -> Vec<&Unpacked> {
    let by_name: BTreeMap<&str, &Unpacked> = pkgs.iter().map(|p| (p.name(), p)).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::with_capacity(pkgs.len());
    fn visit<'a>(
        p: &'a Unpacked,
        by_name: &BTreeMap<&str, &'a Unpacked>,
        done: &mut BTreeSet<String>,
        out: &mut Vec<&'a Unpacked>,
    ) {
        if !done.insert(p.name().to_string()) {
            return;
        }
        for dep in related(p.control.field("Pre-Depends")) {
            if let Some(d) = by_name.get(dep.as_str()) {
                visit(d, by_name, done, out);
            }
        }
        out.push(p);
    }
    for p in pkgs {
        visit(p, &by_name, &mut done, &mut out);
    }
    out
}
