//! Raw policy → validated [`Policy`], collecting every problem.

use super::model::{
    Defaults, DistRule, IdRange, ImageRules, Layer, MigrationRules, NetworkRule, POLICY_VERSION,
    Policy, PolicyRules,
};
use super::raw::{RawDistribution, RawPolicy, RawRange};
use crate::env::{BarrierAction, CheckpointMode, Variant};
use crate::spec::parse::{Sources, file_entry};
use crate::units::{
    AbsPath, ByteSize, HostnamePattern, Hypervisor, MirrorUrl, Seconds, UnixName, ValueError, Word,
};
use crate::yaml::conv::{arch, one_of, pattern, relation};
use crate::yaml::{At, Ctx, Diagnostics, Loc, Source};

pub fn convert(src: &Source, raw: RawPolicy) -> Result<Policy, Diagnostics> {
    let mut cx = Ctx::new(&src.name);
    if raw.version.value != POLICY_VERSION {
        let at = cx.pos(&raw.version);
        cx.error(
            at,
            "version",
            ValueError::new(format!(
                "policy format {} is not supported",
                raw.version.value
            ))
            .hint(format!("this vse reads `version: {POLICY_VERSION}`")),
        );
    }
    let name = cx.parse(&raw.name, "name", Word::parse);
    let distributions = raw.distributions.as_ref().map(|d| Loc {
        at: cx.pos(d),
        value: d
            .value
            .iter()
            .filter_map(|r| dist_rule(&mut cx, r))
            .collect(),
    });
    let (mut allowed_mirrors, mut mirror, mut keyrings) = (None, None, None);
    if let Some(r) = &raw.repositories {
        allowed_mirrors = r.allowed.as_ref().map(|a| Loc {
            at: cx.pos(a),
            value: a
                .value
                .iter()
                .filter_map(|u| cx.parse(u, "repositories.allowed", MirrorUrl::parse))
                .collect(),
        });
        mirror = cx.parse_opt(&r.mirror, "repositories.mirror", MirrorUrl::parse);
        keyrings = r.keyrings.as_ref().map(|k| Loc {
            at: cx.pos(k),
            value: k
                .value
                .iter()
                .filter_map(|p| cx.parse(p, "repositories.keyrings", AbsPath::parse))
                .map(|p| p.value)
                .collect(),
        });
    }
    let (mut required_packages, mut forbidden_packages) = (Vec::new(), Vec::new());
    if let Some(p) = &raw.packages {
        required_packages = p
            .required
            .iter()
            .filter_map(|r| cx.parse(r, "packages.required", relation))
            .collect();
        forbidden_packages = p
            .forbidden
            .iter()
            .filter_map(|r| cx.parse(r, "packages.forbidden", pattern))
            .collect();
    }
    let (mut max_vcpus, mut max_memory, mut vms_per_core) = (None, None, None);
    if let Some(l) = &raw.limits {
        max_vcpus = l
            .max_vcpus
            .as_ref()
            .and_then(|v| cx.range(v, "limits.max_vcpus", 1, 1024));
        max_memory = cx.parse_opt(&l.max_memory, "limits.max_memory", ByteSize::parse);
        vms_per_core = l
            .vms_per_core
            .as_ref()
            .and_then(|v| cx.range(v, "limits.vms_per_core", 1, 64));
    }
    let mut defaults = Defaults::default();
    if let Some(d) = &raw.defaults {
        defaults.vcpus = d
            .vcpus
            .as_ref()
            .and_then(|v| cx.range(v, "defaults.vcpus", 1, 1024));
        defaults.memory = cx.parse_opt(&d.memory, "defaults.memory", ByteSize::parse);
        defaults.variant = cx.parse_opt(&d.variant, "defaults.variant", |s| {
            one_of(s, &Variant::NAMES, Variant::parse)
        });
        defaults.hypervisor = cx.parse_opt(&d.hypervisor, "defaults.hypervisor", Hypervisor::parse);
        defaults.checkpoint = cx.parse_opt(&d.checkpoint, "defaults.checkpoint", |s| {
            one_of(s, &["never", "walltime-end"], |s| {
                CheckpointMode::parse(s).filter(|m| *m != CheckpointMode::Periodic)
            })
        });
    }
    let (mut required_files, mut protected_paths) = (Vec::new(), Vec::new());
    if let Some(f) = &raw.files {
        required_files = f
            .required
            .iter()
            .filter_map(|r| file_entry(&mut cx, r, &src.dir, "files.required", Sources::Host))
            .collect();
        protected_paths = f
            .protected
            .iter()
            .filter_map(|p| cx.parse(p, "files.protected", AbsPath::parse))
            .collect();
    }
    let (mut uid_range, mut gid_range, mut allow_root) = (None, None, None);
    if let Some(u) = &raw.users {
        allow_root = u.allow_root.as_ref().map(|b| cx.loc(b));
        uid_range = u
            .uid_range
            .as_ref()
            .and_then(|r| id_range(&mut cx, r, "users.uid_range"));
        gid_range = u
            .gid_range
            .as_ref()
            .and_then(|r| id_range(&mut cx, r, "users.gid_range"));
    }
    let network = raw.network.as_ref().and_then(|n| {
        let ip_range = cx.parse(&n.ip_range, "network.ip_range", ip_net);
        let hostname = cx.parse(&n.hostname, "network.hostname", HostnamePattern::parse);
        Some(NetworkRule {
            ip_range: ip_range?,
            hostname: hostname?,
        })
    });
    let (mut checkpoint_at_walltime_end, mut checkpoint_min_interval) = (None, None);
    let mut checkpoint_attach_grace = None;
    if let Some(c) = &raw.checkpoint {
        checkpoint_at_walltime_end = c.at_walltime_end.as_ref().map(|b| cx.loc(b));
        checkpoint_min_interval =
            cx.parse_opt(&c.min_interval, "checkpoint.min_interval", Seconds::parse);
        checkpoint_attach_grace =
            cx.parse_opt(&c.attach_grace, "checkpoint.attach_grace", Seconds::parse);
    }
    let hypervisors = raw.hypervisors.as_ref().map(|h| Loc {
        at: cx.pos(&h.allowed),
        value: h
            .allowed
            .value
            .iter()
            .filter_map(|s| cx.parse(s, "hypervisors.allowed", Hypervisor::parse))
            .collect(),
    });
    let migration = raw
        .migration
        .as_ref()
        .map(|m| migration(&mut cx, m))
        .unwrap_or_default();

    let images = raw
        .images
        .as_ref()
        .map(|i| ImageRules {
            allow_imported: i.allow_imported.as_ref().map(|b| cx.loc(b)),
            require_dpkg_database: i.require_dpkg_database.as_ref().map(|b| cx.loc(b)),
            signed_by: (i.signed_by.iter())
                .map(|k| Loc {
                    at: cx.pos(k),
                    value: (k.value.iter())
                        .filter_map(|p| cx.parse(p, "images.signed_by", AbsPath::parse))
                        .map(|p| p.value)
                        .collect(),
                })
                .collect(),
            boot_templates: i.boot_templates.as_ref().map(|b| cx.loc(b)),
        })
        .unwrap_or_default();

    let shares = raw
        .shares
        .as_ref()
        .map(|s| super::shares::convert(&mut cx, s))
        .unwrap_or_default();

    let audit_file =
        (raw.audit.as_ref()).and_then(|a| cx.parse_opt(&a.file, "audit.file", AbsPath::parse));
    let admin_group = (raw.authority.as_ref())
        .and_then(|a| cx.parse_opt(&a.admin_group, "authority.admin_group", UnixName::parse));
    let (cache_max_size, cache_max_age) = raw.cache.as_ref().map_or((None, None), |c| {
        (
            cx.parse_opt(&c.max_size, "cache.max_size", ByteSize::parse),
            cx.parse_opt(&c.max_age, "cache.max_age", Seconds::parse),
        )
    });

    let Some(name) = name else {
        return Err(cx.diags);
    };
    let policy = Policy {
        file: src.name.clone(),
        name,
        description: raw.description,
        layer: Layer::User,
        rules: PolicyRules {
            distributions,
            allowed_mirrors,
            mirror,
            keyrings,
            required_packages,
            forbidden_packages,
            max_vcpus,
            max_memory,
            vms_per_core,
            defaults,
            required_files,
            protected_paths,
            uid_range,
            gid_range,
            allow_root,
            network,
            checkpoint_at_walltime_end,
            checkpoint_min_interval,
            checkpoint_attach_grace,
            hypervisors,
            migration,
            images,
            shares,
            audit_file,
            admin_group,
            cache_max_size,
            cache_max_age,
        },
    };
    cx.diags.into_result(policy)
}

fn dist_rule(cx: &mut Ctx, raw: &At<RawDistribution>) -> Option<DistRule> {
    let r = &raw.value;
    let name = cx.parse(&r.name, "distributions.name", Word::parse);
    let suites = r
        .suites
        .iter()
        .filter_map(|s| cx.parse(s, "distributions.suites", Word::parse))
        .collect();
    let architectures = r.architectures.as_ref().map(|a| {
        a.iter()
            .filter_map(|s| cx.parse(s, "distributions.architectures", arch))
            .collect()
    });
    let components = r.components.as_ref().map(|c| {
        c.iter()
            .filter_map(|s| cx.parse(s, "distributions.components", Word::parse))
            .collect()
    });
    Some(DistRule {
        name: name?,
        suites,
        architectures,
        components,
    })
}

fn id_range(cx: &mut Ctx, raw: &At<RawRange>, field: &str) -> Option<Loc<IdRange>> {
    let RawRange { min, max } = raw.value;
    if min == 0 || min > max {
        let at = cx.pos(raw);
        cx.error(
            at,
            field,
            ValueError::new(format!("{min}-{max} is not a valid id range"))
                .hint("need 1 <= min <= max; id 0 (root) can never be granted"),
        );
        return None;
    }
    Some(Loc {
        value: IdRange { min, max },
        at: cx.pos(raw),
    })
}

fn ip_net(s: &str) -> Result<ipnet::IpNet, ValueError> {
    let net: ipnet::IpNet = s.parse().map_err(|_| {
        ValueError::new(format!("`{s}` is not an IP range"))
            .hint("write a CIDR range such as `10.20.0.0/16`")
    })?;
    if net.trunc() != net {
        return Err(ValueError::new(format!("`{s}` has host bits set"))
            .hint(format!("did you mean `{}`?", net.trunc())));
    }
    Ok(net)
}

fn migration(cx: &mut Ctx, m: &super::raw::RawMigration) -> MigrationRules {
    let persistence = m.persistence.as_ref().and_then(|p| {
        let (k, mm) = (p.value.k, p.value.m);
        if k == 0 || k > mm || mm > 1000 {
            let at = cx.pos(p);
            cx.error(
                at,
                "migration.persistence",
                ValueError::new(format!("{k} of {mm} is not a valid persistence rule"))
                    .hint("need 1 <= k <= m <= 1000, e.g. `{k: 3, m: 5}`"),
            );
            return None;
        }
        Some(Loc {
            value: (k, mm),
            at: cx.pos(p),
        })
    });
    let outlier_sigma = m.outlier_sigma.as_ref().and_then(|s| {
        if s.value > 0.0 && s.value <= 10.0 {
            Some(cx.loc(s))
        } else {
            let at = cx.pos(s);
            cx.error(
                at,
                "migration.outlier_sigma",
                ValueError::new(format!("{} is out of range", s.value)).hint(
                    "expected a number of standard deviations above 0 and at most 10, e.g. 2.0",
                ),
            );
            None
        }
    });
    let (mut barrier_deadline, mut barrier_action) = (None, None);
    if let Some(b) = &m.barrier {
        barrier_deadline = cx.parse_opt(&b.deadline, "migration.barrier.deadline", Seconds::parse);
        barrier_action = cx.parse_opt(&b.action, "migration.barrier.action", |s| {
            one_of(s, &["migrate", "cancel"], |s| match s {
                "migrate" => Some(BarrierAction::Migrate),
                "cancel" => Some(BarrierAction::Cancel),
                _ => None,
            })
        });
    }
    MigrationRules {
        active_memory_threshold: m
            .active_memory_threshold
            .as_ref()
            .and_then(|f| cx.fraction(f, "migration.active_memory_threshold")),
        outlier_sigma,
        persistence,
        oversubscription_threshold: m
            .oversubscription_threshold
            .as_ref()
            .and_then(|f| cx.fraction(f, "migration.oversubscription_threshold")),
        consolidation: m.consolidation.as_ref().map(|c| cx.loc(c)),
        cooldown: cx.parse_opt(&m.cooldown, "migration.cooldown", Seconds::parse),
        max_concurrent: m
            .max_concurrent
            .as_ref()
            .and_then(|v| cx.range(v, "migration.max_concurrent", 1, 64)),
        barrier_deadline,
        barrier_action,
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::parse_source;
    use crate::yaml::Source;

    fn parse(text: &str) -> Result<crate::policy::Policy, String> {
        let src = Source::from_bytes(
            "site.policy.yaml",
            std::path::Path::new("site.policy.yaml"),
            text.as_bytes().to_vec(),
        );
        parse_source(&src).map_err(|d| d.to_string())
    }

    #[test]
    fn audit_file_is_an_absolute_path_with_its_position() {
        let p =
            parse("version: 1\nname: site\naudit:\n  file: /var/log/vse/audit.jsonl\n").unwrap();
        let f = p.audit_file.as_ref().expect("audit.file kept");
        assert_eq!(f.value.as_str(), "/var/log/vse/audit.jsonl");
        assert_eq!(f.at.to_string(), "site.policy.yaml:4:9");
        let none = parse("version: 1\nname: site\n").unwrap();
        assert_eq!(none.audit_file, None);

        let e = parse("version: 1\nname: site\naudit:\n  file: log/audit.jsonl\n").unwrap_err();
        assert!(
            e.contains(
                "site.policy.yaml:4:9: audit.file: `log/audit.jsonl` is not an absolute path"
            ) && e.contains("hint: "),
            "{e}"
        );
        let e = parse("version: 1\nname: site\naudit:\n  path: /var/log/a.jsonl\n").unwrap_err();
        assert!(
            e.contains("site.policy.yaml:4:3: unknown key `path`") && e.contains("file"),
            "{e}"
        );
    }
}
