//! How each policy field stacks: the one table `merge::stack` follows. A stack is only as
//! strong as its weakest field, so every field of the policy format has a row here, and a test
//! walks the format's own field lists (serde's) so that a field added without a rule fails.

/// How a later policy of a stack may change a field an earlier one set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeRule {
    /// An upper limit (or a switch whose `false` is the strict side): a later policy may lower
    /// it, never raise it.
    Min,
    /// A lower limit (or a switch whose `true` is the strict side): a later policy may raise
    /// it, never lower it.
    Max,
    /// A range (ids, addresses): a later one must lie inside the earlier one.
    Within,
    /// What is allowed: a later list may only name what the earlier one allows; what a later
    /// entry leaves open stays as narrow as the earlier entry.
    SubsetOf,
    /// Requirements and prohibitions: every policy's entries hold; none can be taken back.
    Union,
    /// Once set, a later policy may only restate the same value; a later policy may set it
    /// when no earlier one did.
    Fixed,
    /// What the site's archive is and which keys vouch for it, and where the site's audit
    /// records go: [`MergeRule::Fixed`], and a user's policy may not set it even where the
    /// site's policies leave it unset (the built-in default then stays), since it would make
    /// vse trust the user's choice for the site's archive or its audit trail.
    TrustRoot,
    /// A fallback for what a spec leaves out, which a spec could set itself: a later policy
    /// may replace it; it must stay within the limits of the whole stack.
    Default,
    /// A permission that is off unless the site grants it: [`MergeRule::Min`], and a user's
    /// policy may not turn it on where no earlier policy did.
    Grant,
    /// About the policy file itself (format version, name, description): not stacked.
    Own,
}

use MergeRule::*;

/// Every field of the policy format (YAML keys, dotted) with its rule.
pub const MERGE_RULES: &[(&str, MergeRule)] = &[
    ("version", Own),
    ("name", Own),
    ("description", Own),
    ("distributions.name", SubsetOf),
    ("distributions.suites", SubsetOf),
    ("distributions.architectures", SubsetOf),
    ("distributions.components", SubsetOf),
    ("repositories.allowed", SubsetOf),
    ("repositories.mirror", TrustRoot),
    ("repositories.keyrings", TrustRoot),
    ("packages.required", Union),
    ("packages.forbidden", Union),
    ("limits.max_vcpus", Min),
    ("limits.max_memory", Min),
    ("limits.vms_per_core", Min),
    ("defaults.vcpus", Default),
    ("defaults.memory", Default),
    ("defaults.variant", Default),
    ("defaults.hypervisor", Default),
    ("defaults.checkpoint", Default),
    ("files.required", Union),
    ("files.protected", Union),
    ("users.uid_range", Within),
    ("users.gid_range", Within),
    ("network.ip_range", Within),
    ("network.hostname", Fixed),
    ("checkpoint.at_walltime_end", Max),
    ("checkpoint.min_interval", Max),
    ("checkpoint.attach_grace", Min),
    ("hypervisors.allowed", SubsetOf),
    ("migration.active_memory_threshold", Fixed),
    ("migration.outlier_sigma", Fixed),
    ("migration.persistence", Fixed),
    ("migration.oversubscription_threshold", Fixed),
    ("migration.consolidation", Fixed),
    ("migration.cooldown", Max),
    ("migration.max_concurrent", Min),
    ("migration.barrier.deadline", Fixed),
    ("migration.barrier.action", Fixed),
    ("images.allow_imported", Min),
    ("images.require_dpkg_database", Max),
    ("images.signed_by", Union),
    ("images.boot_templates", Min),
    ("users.allow_root", Grant),
    ("shares.allowed", SubsetOf),
    ("shares.forbidden", Union),
    ("shares.default", Default),
    ("audit.file", TrustRoot),
    ("authority.admin_group", TrustRoot),
    ("cache.max_size", Min),
    ("cache.max_age", Min),
];

/// The rule of `key`. Panics on a key without a row: the stacking code names only keys of the
/// table, which a unit test checks.
pub fn rule(key: &str) -> MergeRule {
    MERGE_RULES
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, r)| *r)
        .unwrap_or_else(|| panic!("policy field `{key}` has no row in MERGE_RULES"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::walk::fields;

    #[test]
    fn every_field_of_the_format_has_a_merge_rule() {
        let keys = crate::walk::policy_keys();
        assert!(
            keys.len() > 30,
            "the walk found the format's fields: {keys:?}"
        );
        let missing: Vec<_> = (keys.iter())
            .filter(|k| !MERGE_RULES.iter().any(|(r, _)| r == k))
            .collect();
        assert!(
            missing.is_empty(),
            "policy fields without a row in MERGE_RULES (add one, and stack them by it): {missing:?}"
        );
        let stale: Vec<_> = (MERGE_RULES.iter())
            .filter(|(r, _)| !keys.iter().any(|k| k == r))
            .collect();
        assert!(stale.is_empty(), "rows for no field: {stale:?}");
    }

    #[test]
    fn the_walk_sees_a_new_field() {
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct Grown {
            version: u32,
            brand_new: u32,
        }
        let fs = fields::<Grown>();
        assert_eq!(fs, ["version", "brand_new"]);
        assert!(!MERGE_RULES.iter().any(|(k, _)| *k == "brand_new"));
    }
}
