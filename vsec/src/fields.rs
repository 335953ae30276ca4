//! Where every field of the spec and policy formats takes effect, and the test that reads the
//! effect (in a lock, a built image, a booted guest or a launch's verdict). A test walks the
//! formats' own key lists (serde's) against these tables: a field added without its row
//! fails, and every row names a test that exists. `vse check --explain` prints each shown
//! key's row.

/// One field: its dotted key, where it takes effect, and the test that shows the effect
/// (`path/from/the/repository.rs::function`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effect {
    pub key: &'static str,
    pub applied: &'static str,
    pub test: &'static str,
}

const fn e(key: &'static str, applied: &'static str, test: &'static str) -> Effect {
    Effect { key, applied, test }
}

const GUEST_FIELDS: &str =
    "tests/build_cli.rs::accounts_files_and_environment_are_in_the_guest_as_the_spec_says";
const LOCK_IS_APTS: &str = "tests/lock_cli.rs::lock_is_apts_choice_deterministic_and_checkable";
const CHECK_GOLDEN: &str = "tests/cli_check.rs::invalid_cases_exit_2_with_the_golden_stderr";
const LIMITS: &str = "tests/policy_stack.rs::the_limits_check_reports_are_the_ones_launch_enforces";
const LAUNCH_FIELDS: &str = "tests/launch_checkpoint.rs::a_spec_s_sizes_checkpoints_and_hypervisor_are_what_its_launch_does";
const LABELS: &str =
    "tests/cli_check.rs::names_and_descriptions_are_shown_and_only_the_spec_s_are_hashed";
const ARCHIVE: &str =
    "tests/lock_cli.rs::archive_fields_choose_where_vse_lock_reads_and_what_it_trusts";
const DEFAULTS: &str = "tests/cli_check.rs::policy_defaults_fill_what_a_spec_leaves_out";
const MIGRATION_MAP: &str =
    "control/tests/migrate_policy.rs::site_policy_maps_every_migration_setting";

/// The spec format (`*.vse.yaml`).
pub const SPEC: &[Effect] = &[
    e(
        "version",
        "every command: a spec of another format version is refused",
        CHECK_GOLDEN,
    ),
    e(
        "name",
        "vse check: the environment's name; part of the environment's hash",
        LABELS,
    ),
    e(
        "description",
        "vse check: shown; part of the environment's hash",
        LABELS,
    ),
    e(
        "base.distribution",
        "merge: must be one of the policy's distributions",
        CHECK_GOLDEN,
    ),
    e(
        "base.suite",
        "vse lock: the archive suite resolved from",
        LOCK_IS_APTS,
    ),
    e(
        "base.architecture",
        "vse lock: the indices read; vse build: the lock must match",
        ARCHIVE,
    ),
    e(
        "base.components",
        "vse lock: the components of every archive",
        ARCHIVE,
    ),
    e(
        "base.mirror",
        "vse lock: the archive fetched from (unless the policy's mirror)",
        ARCHIVE,
    ),
    e(
        "base.snapshot",
        "vse lock: the archive pinned to a snapshot",
        ARCHIVE,
    ),
    e(
        "base.variant",
        "vse lock: the base package set resolved",
        LOCK_IS_APTS,
    ),
    e(
        "base.recommends",
        "vse lock: whether Recommends are followed",
        "vsec/tests/lock_golden.rs::the_lock_holds_the_expected_choices",
    ),
    e(
        "kernel",
        "vse lock and build: the kernel the image boots",
        LOCK_IS_APTS,
    ),
    e(
        "packages",
        "vse lock and build: installed in the image",
        "tests/build_cli.rs::mpi_example_builds_and_runs_mpirun",
    ),
    e(
        "files.path",
        "vse build: a file at that path in the image",
        GUEST_FIELDS,
    ),
    e(
        "files.content",
        "vse build: the file's bytes",
        "tests/build_sandbox.rs::a_root_build_sandbox_is_confined_seen_from_inside",
    ),
    e(
        "files.source",
        "vse build: the file's bytes, read beneath the spec's directory",
        "imgbuild/tests/spec_sources.rs::a_spec_source_swapped_for_a_symlink_is_never_followed",
    ),
    e("files.mode", "vse build: the file's mode", GUEST_FIELDS),
    e(
        "files.owner",
        "vse build: the file's owner (root or a spec user)",
        GUEST_FIELDS,
    ),
    e(
        "files.group",
        "vse build: the file's group (root or a spec group)",
        GUEST_FIELDS,
    ),
    e(
        "groups.name",
        "vse build: the image's groupadd",
        GUEST_FIELDS,
    ),
    e(
        "groups.gid",
        "vse build: the image's groupadd --gid",
        GUEST_FIELDS,
    ),
    e("users.name", "vse build: the image's useradd", GUEST_FIELDS),
    e(
        "users.uid",
        "vse build: useradd --uid (and the gid of the user's own group)",
        GUEST_FIELDS,
    ),
    e(
        "users.groups",
        "vse build: the first is the primary group, the rest supplementary",
        GUEST_FIELDS,
    ),
    e("users.shell", "vse build: useradd --shell", GUEST_FIELDS),
    e(
        "users.home",
        "vse build: useradd --home-dir --create-home",
        GUEST_FIELDS,
    ),
    e(
        "environment",
        "every command in the guest (vse run, launch, srun --vse): /etc/environment, read by the guest agent",
        GUEST_FIELDS,
    ),
    e(
        "post_install",
        "vse build: run in the build sandbox, the policy checked after each",
        "tests/build_sandbox.rs::a_root_build_sandbox_is_confined_seen_from_inside",
    ),
    e(
        "resources.vcpus",
        "vse launch SPEC, srun --vse=SPEC: each VM's vCPUs (unless --vcpus)",
        LAUNCH_FIELDS,
    ),
    e(
        "resources.memory",
        "vse launch SPEC, srun --vse=SPEC: each VM's memory (unless --memory)",
        "tests/installed.rs::installed_vse_builds_runs_and_launches_a_spec_from_an_empty_directory",
    ),
    e(
        "checkpoint.mode",
        "vse launch SPEC: never, at walltime end, or periodic",
        LAUNCH_FIELDS,
    ),
    e(
        "checkpoint.interval",
        "vse launch SPEC: the period of periodic checkpoints",
        LAUNCH_FIELDS,
    ),
    e(
        "hypervisor",
        "vse launch SPEC: the hypervisor chosen by --hypervisor auto",
        LAUNCH_FIELDS,
    ),
    e(
        "shares",
        "vse check: refused outside shares.allowed or under shares.forbidden (absolute paths); vse launch SPEC, srun --vse=SPEC: resolved on the host as the user (canonical, readable) and mounted in every guest, served as the user",
        "vsec/src/shares/tests_launch.rs::a_spec_share_is_checked_as_written_and_resolved_on_the_host",
    ),
];

/// The policy format (`*.policy.yaml`).
pub const POLICY: &[Effect] = &[
    e(
        "version",
        "every command: a policy of another format version is refused",
        CHECK_GOLDEN,
    ),
    e(
        "name",
        "vse check: each policy shown by its name and file, in stacking order",
        LABELS,
    ),
    e(
        "description",
        "vse check: shown after the policy's name; not part of the environment's hash",
        LABELS,
    ),
    e(
        "distributions.name",
        "merge: the spec's base.distribution must be listed",
        CHECK_GOLDEN,
    ),
    e(
        "distributions.suites",
        "merge: the spec's base.suite must be listed",
        CHECK_GOLDEN,
    ),
    e(
        "distributions.architectures",
        "merge: the architecture must be listed",
        CHECK_GOLDEN,
    ),
    e(
        "distributions.components",
        "merge: the spec's components must be listed",
        CHECK_GOLDEN,
    ),
    e(
        "repositories.allowed",
        "vse lock and build: every archive must lie within",
        "tests/lock_cli.rs::unknown_forbidden_and_malformed_requests_exit_2_and_write_nothing",
    ),
    e(
        "repositories.mirror",
        "vse lock: every index is fetched from it",
        ARCHIVE,
    ),
    e(
        "repositories.keyrings",
        "vse lock and build: the keys that verify the archive",
        ARCHIVE,
    ),
    e(
        "packages.required",
        "vse lock and build: installed; launch: the image must hold them",
        "tests/build_cli.rs::minimal_spec_check_lock_build_run_and_noop_rebuild",
    ),
    e(
        "packages.forbidden",
        "vse lock, build, import: refused; launch: an image holding one is refused",
        "tests/site_policy.rs::an_image_built_before_a_rule_is_refused_at_launch",
    ),
    e(
        "limits.max_vcpus",
        "check, launch, run, srun --vse: more vCPUs refused",
        LIMITS,
    ),
    e(
        "limits.max_memory",
        "check, launch, run, srun --vse: more memory refused",
        LIMITS,
    ),
    e(
        "limits.vms_per_core",
        "vse launch: placement and pinning of the VMs on a node's cores",
        "launcher/src/launch/plan.rs::distinct_cores_then_policy_bound",
    ),
    e(
        "defaults.vcpus",
        "a spec's vCPUs when it gives none",
        DEFAULTS,
    ),
    e(
        "defaults.memory",
        "a spec's memory when it gives none",
        LAUNCH_FIELDS,
    ),
    e(
        "defaults.variant",
        "a spec's base variant when it gives none",
        ARCHIVE,
    ),
    e(
        "defaults.hypervisor",
        "vse launch: the hypervisor when neither spec nor flag names one",
        LAUNCH_FIELDS,
    ),
    e(
        "defaults.checkpoint",
        "a spec's checkpoint mode when it gives none",
        DEFAULTS,
    ),
    e(
        "files.required",
        "vse build: written last (it wins); launch: the image must have it",
        "tests/slurm_spank.rs::a_spec_is_built_on_the_node",
    ),
    e(
        "files.protected",
        "check, build (after each post_install), launch: may not change",
        CHECK_GOLDEN,
    ),
    e(
        "users.uid_range",
        "check: the spec's uids; launch: the image's",
        CHECK_GOLDEN,
    ),
    e(
        "users.gid_range",
        "check: the spec's gids (and users' own groups)",
        CHECK_GOLDEN,
    ),
    e(
        "network.ip_range",
        "vse launch: the job network's addresses",
        "tests/launch_net.rs::ranks_reach_each_other_over_the_job_network",
    ),
    e(
        "network.hostname",
        "vse launch: each guest's hostname and /etc/hosts",
        "tests/launch_net.rs::ranks_reach_each_other_over_the_job_network",
    ),
    e(
        "checkpoint.at_walltime_end",
        "vse launch: a checkpoint before the allocation ends (refused when its end is unknown)",
        "tests/launch_checkpoint.rs::a_job_checkpointed_at_walltime_end_and_on_preemption_resumes_without_losing_a_number",
    ),
    e(
        "checkpoint.min_interval",
        "vse check, launch: a spec's checkpoint.interval below it is refused; launch: no period is shorter",
        LAUNCH_FIELDS,
    ),
    e(
        "checkpoint.attach_grace",
        "vse launch: how long VMs outlive a lost front-end at most",
        LIMITS,
    ),
    e(
        "hypervisors.allowed",
        "check, launch, run, srun --vse: another hypervisor is refused",
        "tests/policy_stack.rs::the_allowed_hypervisors_check_reports_are_the_ones_launch_enforces",
    ),
    e(
        "migration.active_memory_threshold",
        "vse launch: the migration daemon's failure-avoidance threshold",
        "tests/launch_migrate.rs::hog_on_a_node_moves_its_vm_to_the_spare_at_a_barrier",
    ),
    e(
        "migration.outlier_sigma",
        "vse launch: the migration daemon's outlier test",
        MIGRATION_MAP,
    ),
    e(
        "migration.persistence",
        "vse launch: the migration daemon's k-of-m persistence",
        MIGRATION_MAP,
    ),
    e(
        "migration.oversubscription_threshold",
        "vse launch: the migration daemon's oversubscription threshold",
        "tests/launch_migrate.rs::status_page_shows_the_nodes_and_the_migration_in_a_browser",
    ),
    e(
        "migration.consolidation",
        "vse launch: the migration daemon's consolidation",
        MIGRATION_MAP,
    ),
    e(
        "migration.cooldown",
        "vse launch: no VM moves twice within it",
        MIGRATION_MAP,
    ),
    e(
        "migration.max_concurrent",
        "vse launch: moves at once",
        "control/tests/migrate_policy.rs::partition_policy_stacks_on_the_site_policy",
    ),
    e(
        "migration.barrier.deadline",
        "vse launch: how long a migration waits for the ranks' barrier",
        "tests/mpi_migrate.rs::mpi_job_goes_on_when_its_ranks_miss_the_barrier_deadline",
    ),
    e(
        "migration.barrier.action",
        "vse launch: migrate anyway or cancel at the deadline",
        "tests/mpi_migrate.rs::mpi_job_goes_on_when_its_ranks_miss_the_barrier_deadline",
    ),
    e(
        "images.allow_imported",
        "vse import, launch, run: imported images refused",
        "tests/import_cli.rs::the_same_archive_imports_byte_identically_and_policies_apply",
    ),
    e(
        "images.require_dpkg_database",
        "vse import, launch, run: an image without dpkg's database refused",
        "tests/import_cli.rs::hostile_tarballs_are_refused_with_exit_2_and_leave_nothing",
    ),
    e(
        "images.signed_by",
        "vse run, launch, srun --vse: the image must be signed by these keys",
        "tests/image_signing.rs::run_and_launch_refuse_every_image_not_signed_by_a_valid_site_key",
    ),
    e(
        "images.boot_templates",
        "vse launch: whether VMs may start from boot templates",
        "tests/launch_vms.rs::local_two_nodes_prefixed_output_and_exit_status",
    ),
    e(
        "users.allow_root",
        "vse run, vse launch, srun --vse: whether --guest-root may run the command as the guest's root",
        "tests/launch_vms.rs::guest_root_runs_only_where_a_site_policy_grants_it",
    ),
    e(
        "shares.allowed",
        "vse check (the spec's absolute shares), vse run, vse launch, srun --vse (every share, on its canonical path, as the user): only directories under these, read-only under a `mode: ro` one",
        "vsec/src/shares/tests_resolve.rs::a_symlink_inside_an_allowed_prefix_cannot_lead_out",
    ),
    e(
        "shares.forbidden",
        "vse check, vse run, vse launch, srun --vse: a share under one is refused, whatever shares.allowed says",
        "vsec/src/shares/tests_resolve.rs::forbidden_wins_over_allowed",
    ),
    e(
        "shares.default",
        "vse run, vse launch, srun --vse: the directories every job gets unasked (default: the launch directory; --no-default-shares leaves them out)",
        "tests/shares.rs::a_job_reads_and_writes_its_directory_as_its_user",
    ),
    e(
        "audit.file",
        "vse build, import, sign, run, launch (its checkpoints and migrations), checkpoint, evacuate, srun --vse: each admission or refusal appends one JSON record to this file (and to syslog) before the action; an action whose record cannot be written is refused; `vse audit` reads them back",
        "tests/launch_migrate.rs::evacuate_moves_a_nodes_vm_to_the_spare_and_drains_the_node",
    ),
    e(
        "authority.admin_group",
        "vse checkpoint, evacuate, attach, status run by root through sudo on another user's job: the caller (SUDO_UID) must be in this group, else refused naming the policy line; the audit record names the caller and the group",
        "tests/user_path.rs::the_readme_user_path_as_an_ordinary_account",
    ),
    e(
        "cache.max_size",
        "vse launch (each node's image cache and boot templates), vse launch and run (the image stores under the cache root), srun --vse (the node's stores): least recently used entries removed until the rest fit, never one in use or used in the last 10 minutes",
        "base/src/evict.rs::the_least_recently_used_go_first_until_the_rest_fit",
    ),
    e(
        "cache.max_age",
        "the same caches: an entry unused for longer is removed",
        LAUNCH_FIELDS,
    ),
];

/// Names `vse check` shows for fields, where they differ from the formats' keys.
const SHOWN_AS: &[(&str, &str)] = &[
    ("base.install_recommends", "base.recommends"),
    ("base.keyrings", "repositories.keyrings"),
    ("required_packages", "packages.required"),
    ("forbidden", "packages.forbidden"),
    ("hypervisor.preferred", "hypervisor"),
    ("hypervisor.allowed", "hypervisors.allowed"),
    ("share_policy.allowed", "shares.allowed"),
    ("share_policy.default", "shares.default"),
    ("share_policy.forbidden", "shares.forbidden"),
];

/// The row of a key as the formats or `vse check` name it (`files[2]` is `files`' row).
pub fn effect_of(shown: &str) -> Option<&'static Effect> {
    let key = shown.split('[').next().unwrap_or(shown);
    let key = SHOWN_AS
        .iter()
        .find(|(s, _)| *s == key)
        .map_or(key, |(_, k)| *k);
    let prefixed =
        |e: &&Effect| e.key == key || e.key.strip_prefix(key).is_some_and(|r| r.starts_with('.'));
    SPEC.iter()
        .find(|e| e.key == key)
        .or_else(|| POLICY.iter().find(|e| e.key == key))
        .or_else(|| SPEC.iter().find(prefixed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn covers(table: &[Effect], keys: &[String], format: &str) {
        assert!(
            keys.len() > 25,
            "the walk found the {format}'s keys: {keys:?}"
        );
        let missing: Vec<_> = (keys.iter())
            .filter(|k| !table.iter().any(|e| e.key == k.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{format} fields without a row (say where each takes effect, and which test shows it): {missing:?}"
        );
        let stale: Vec<_> = (table.iter())
            .filter(|e| !keys.iter().any(|k| k == e.key))
            .collect();
        assert!(stale.is_empty(), "rows for no {format} field: {stale:?}");
    }

    #[test]
    fn every_field_of_both_formats_has_a_row() {
        covers(SPEC, &crate::walk::spec_keys(), "spec");
        covers(POLICY, &crate::walk::policy_keys(), "policy");
    }

    /// Each named test exists where its row says: a function of that name in that file.
    #[test]
    fn every_named_test_exists() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for e in SPEC.iter().chain(POLICY) {
            let (file, path) = e.test.split_once("::").expect("path::function");
            let name = path.rsplit("::").next().unwrap_or(path);
            let text = std::fs::read_to_string(repo.join(file))
                .unwrap_or_else(|err| panic!("{}: {file}: {err}", e.key));
            assert!(
                text.contains(&format!("fn {name}(")),
                "{}: no `fn {name}` in {file}",
                e.key
            );
        }
    }

    #[test]
    fn check_s_names_find_their_rows() {
        assert_eq!(effect_of("files[2]").map(|e| e.key), Some("files.path"));
        assert_eq!(effect_of("users[0]").map(|e| e.key), Some("users.name"));
        assert_eq!(
            effect_of("forbidden[1]").map(|e| e.key),
            Some("packages.forbidden")
        );
        assert_eq!(
            effect_of("resources.vcpus").map(|e| e.key),
            Some("resources.vcpus")
        );
        assert_eq!(
            effect_of("limits.max_vcpus").map(|e| e.key),
            Some("limits.max_vcpus")
        );
        assert!(effect_of("no.such").is_none());
    }
}
