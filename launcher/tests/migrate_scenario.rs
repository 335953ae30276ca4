//! The papers' two scenarios, scaled to one 2-core machine, with real samples and real VMs:
//! (a) failure avoidance (seed 002 §4.1): a memory hog outside the job on one of 4 nodes is
//! detected by threshold + leave-one-out outlier + persistence, its VM is live-migrated to a
//! free node at a barrier, the message-checking program loses and repeats nothing, the node
//! ends in the defunct pool; (b) speculative oversubscription (seed 000 §VI-A): VMs grow
//! until the node's Active memory crosses the threshold, and they are spread to free nodes.
//! Plus: no migration under normal noise over a long run of real samples.
//!
//! Every node is a memory cgroup (see `migrate_support::NodeCgroups`): the nodes share one
//! machine, so each gets its own MemTotal (the cgroup limit) and Active (its processes'
//! memory: its VMs' QEMU processes, and the hog when there is one).

mod migrate_support;

use control::migrate::{
    BarrierConfig, BarrierServer, Daemon, DeadlineAction, MigrationConfig, Outcome, run_plan,
};
use control::model::{ClusterView, Plan, Pool};
use control::state::StateDb;
use migrate_support::*;
use monitor::{Sample, Sampler, SamplerConfig, VmProcess};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use testkit::hog::Hog;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn samplers(names: &[&str], cg: &NodeCgroups) -> Vec<Sampler> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut c = SamplerConfig::new(node(n));
            c.mem_cgroup = Some(cg.dirs[i].clone());
            Sampler::new(c)
        })
        .collect()
}

/// One monitoring round: every node's sample into the controller's state.
fn sample_nodes(db: &mut StateDb, samplers: &mut [Sampler]) -> Vec<f64> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    for s in samplers.iter_mut() {
        let ns = s.sample_node().expect("node sample");
        out.push(ns.mem.active_ratio());
        batch.push(Sample::Node(ns));
    }
    db.record_samples(&batch).unwrap();
    out
}

fn view(db: &StateDb) -> ClusterView {
    db.cluster_view(now_ms()).unwrap()
}

#[test]
fn no_migration_under_normal_noise_but_a_hog_is_caught() {
    // A 4-node job and one free node (a destination, so a prediction can become a plan).
    let names = ["q1", "q2", "q3", "q4", "q5"];
    let Some(cg) = NodeCgroups::create("noise", 5, 256) else {
        return;
    };
    let t = Tmp::new("noise");
    let mut db = StateDb::open(&t.path("state.db")).unwrap();
    for (i, n) in names.iter().enumerate() {
        db.upsert_node(&node(n), Pool::Free).unwrap();
        if i < 4 {
            db.add_vm(&jid("j"), &vid(&format!("v{i}")), &node(n), 64 * 1024)
                .unwrap();
        }
    }
    // Healthy, noisy nodes: each one's memory use jumps between 40 and 110 MiB of 256.
    let noise: Vec<Hog> = cg.dirs[..4]
        .iter()
        .map(|d| Hog::start_pattern(d, "40-110"))
        .collect();
    let mut daemon = Daemon::new(MigrationConfig::default()).unwrap();
    let mut s = samplers(&names, &cg);
    let (mut lo, mut hi) = (f64::MAX, 0f64);
    for _ in 0..150 {
        for r in sample_nodes(&mut db, &mut s) {
            lo = lo.min(r);
            hi = hi.max(r);
        }
        let plans = daemon.evaluate(&view(&db));
        assert!(plans.is_empty(), "migration under normal noise: {plans:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("150 rounds of real samples, Active/MemTotal between {lo:.3} and {hi:.3}: 0 plans");
    assert!(
        hi - lo > 0.1,
        "the noise was not real (Active ratio only moved {lo:.3}..{hi:.3})"
    );
    // The same loop does fire on a real hog: the test above could have failed.
    drop(noise);
    let _hog = Hog::start(&cg.dirs[1], 200);
    let mut fired = None;
    for round in 0..100 {
        sample_nodes(&mut db, &mut s);
        let plans = daemon.evaluate(&view(&db));
        if !plans.is_empty() {
            assert_eq!(plans.len(), 1, "{plans:?}");
            fired = plans.into_iter().next().map(|p| (round, p));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (round, p) = fired.expect("the hog on q2 was never detected");
    assert_eq!(p.rule, "failure-avoidance");
    assert_eq!(p.source, node("q2"));
    // Persistence: k = 3 of m = 5 rounds must agree before anything fires.
    assert!(
        round >= 2,
        "fired after {} round(s), before persistence",
        round + 1
    );
}

fn strict() -> BarrierConfig {
    BarrierConfig {
        deadline_s: 120,
        on_deadline: DeadlineAction::Cancel,
    }
}

#[test]
fn failure_avoidance_moves_the_hogged_nodes_vm_at_a_barrier() {
    let Some(g) = guest() else { return };
    let names = ["n1", "n2", "n3", "n4", "n5"];
    let Some(cg) = NodeCgroups::create("fa", 5, 768) else {
        return;
    };
    let t = Tmp::new("fa");
    let mut cl = Cluster::new(&t, &names, Some(&cg.dirs));
    let mut db = StateDb::open(&t.path("state.db")).unwrap();
    for n in names {
        db.upsert_node(&node(n), Pool::Free).unwrap();
    }
    let server = BarrierServer::bind(&t.path("barrier.sock")).unwrap();
    for i in 1..=4 {
        let (vm, n) = (format!("vm{i}"), format!("n{i}"));
        db.add_vm(&jid("job"), &vid(&vm), &node(&n), 128 * 1024)
            .unwrap();
        cl.boot(&g, &vm, &n, 128, &t, server.path());
    }
    let mut cfg = MigrationConfig::default();
    cfg.oversubscription.enabled = false;
    cfg.barrier = strict();
    let mut daemon = Daemon::new(cfg).unwrap();
    let mut s = samplers(&names, &cg);

    // Quiet phase: the healthy job triggers nothing; the two views of a VM are both there.
    for _ in 0..8 {
        sample_nodes(&mut db, &mut s);
        assert!(daemon.evaluate(&view(&db)).is_empty());
        std::thread::sleep(Duration::from_millis(250));
    }
    let pid = cl.fleet.pid(&vid("vm2")).unwrap();
    let vs = s[1].sample_vm(
        &VmProcess {
            vm: vid("vm2"),
            pid,
        },
        &mut cl.fleet,
    );
    let (host, guest_view) = (vs.host.clone().unwrap(), vs.guest.clone().unwrap());
    eprintln!(
        "vm2 host view: RSS {} KiB; guest view: MemTotal {} KiB, Active {} KiB",
        host.rss_kib, guest_view.mem.total_kib, guest_view.mem.active_kib
    );
    assert!(guest_view.mem.total_kib > 64 * 1024 && guest_view.mem.total_kib <= 128 * 1024);
    db.record_samples(&[Sample::Vm(vs)]).unwrap();

    // The hog: outside the job, inside node n2, up to ~88% of its memory.
    let used = cg.usage_mib(1);
    let hog_mib = (768u64 * 88 / 100).saturating_sub(used).max(64);
    let _hog = Hog::start(&cg.dirs[1], hog_mib);
    eprintln!("n2 used {used} MiB before the hog; hog holds {hog_mib} MiB");
    let apps: Vec<App> = (1..=4)
        .map(|i| cl.run_msgcheck("job", &format!("vm{i}"), 300, 40))
        .collect();
    for i in 1..=4 {
        wait_rank(&server, "job", &format!("vm{i}"));
    }
    let start = Instant::now();
    let mut rounds = 0;
    let plan: Plan = loop {
        rounds += 1;
        let r = sample_nodes(&mut db, &mut s);
        if let Some(p) = daemon.evaluate(&view(&db)).pop() {
            eprintln!("round {rounds}: Active ratios {r:.3?} -> plan {p:?}");
            break p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no plan after {rounds} rounds; last ratios {r:.3?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(plan.rule, "failure-avoidance");
    assert_eq!(plan.source, node("n2"));
    assert_eq!(plan.moves.len(), 1);
    assert_eq!(plan.moves[0].vm, vid("vm2"));
    assert_eq!(plan.moves[0].dest, node("n5"));
    assert!(rounds >= 3, "fired before k = 3 rounds agreed");
    let out = run_plan(&mut db, &server, &mut cl.fleet, &plan, &strict()).expect("run_plan");
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let rec = &cl.fleet.records()[0];
    eprintln!(
        "accelerator: {}; live migration {} ms (downtime {} ms)",
        cl.accel, rec.report.total_time_ms, rec.report.downtime_ms
    );
    for (i, app) in apps.into_iter().enumerate() {
        let sum = app.finish();
        let want = if i == 1 { "migrated=1" } else { "migrated=0" };
        assert!(
            sum.contains("received=300 bad=0") && sum.contains(want),
            "vm{}: {sum}",
            i + 1
        );
    }
    assert_eq!(pool(&db, "n2"), Pool::Defunct);
    assert_eq!(pool(&db, "n5"), Pool::Allocated);
    let on: Vec<(String, String)> = db
        .vms(None)
        .unwrap()
        .into_iter()
        .map(|v| (v.vm.to_string(), v.node.to_string()))
        .collect();
    assert!(on.contains(&("vm2".into(), "n5".into())), "{on:?}");
    assert_counter_continuous(&t.path("vm2.console"));
    // The defunct node is never a destination again, and the job's nodes are quiet.
    for _ in 0..6 {
        sample_nodes(&mut db, &mut s);
        let plans = daemon.evaluate(&view(&db));
        assert!(plans.is_empty(), "{plans:?}");
    }
}

#[test]
fn speculative_oversubscription_spreads_growing_vms() {
    let Some(g) = guest() else { return };
    let names = ["o1", "o2", "o3"];
    let Some(cg) = NodeCgroups::create("os", 3, 2048) else {
        return;
    };
    let t = Tmp::new("os");
    let mut cl = Cluster::new(&t, &names, Some(&cg.dirs));
    let mut db = StateDb::open(&t.path("state.db")).unwrap();
    for n in names {
        db.upsert_node(&node(n), Pool::Free).unwrap();
    }
    let server = BarrierServer::bind(&t.path("barrier.sock")).unwrap();
    // Two VMs whose maxima (256 MiB each) the node would not hold if both filled up.
    for vm in ["w1", "w2"] {
        db.add_vm(&jid("job"), &vid(vm), &node("o1"), 256 * 1024)
            .unwrap();
        cl.boot(&g, vm, "o1", 256, &t, server.path());
    }
    // Oversubscribed: o1's memory is what its VMs use now plus a little, not their maxima.
    let used = cg.usage_mib(0);
    let limit = used + 200;
    cg.set_limit(0, limit, cg.is_v2());
    eprintln!("o1 uses {used} MiB with both VMs booted; its MemTotal is now {limit} MiB");
    let mut cfg = MigrationConfig::default();
    cfg.failure_avoidance.enabled = false;
    cfg.oversubscription.active_ratio = 0.8;
    cfg.barrier = BarrierConfig {
        deadline_s: 60,
        on_deadline: DeadlineAction::Cancel,
    };
    let mut daemon = Daemon::new(cfg.clone()).unwrap();
    let mut s = samplers(&names, &cg);
    for _ in 0..4 {
        sample_nodes(&mut db, &mut s);
        assert!(
            daemon.evaluate(&view(&db)).is_empty(),
            "fired before growth"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let apps: Vec<App> = ["w1", "w2"]
        .iter()
        .map(|vm| cl.run_msgcheck("job", vm, 400, 40))
        .collect();
    for vm in ["w1", "w2"] {
        wait_rank(&server, "job", vm);
    }
    // The job's memory grows (files in the guests' tmpfs) until the daemon acts.
    let mut grown = 0;
    let start = Instant::now();
    let plan = loop {
        let r = sample_nodes(&mut db, &mut s);
        if let Some(p) = daemon.evaluate(&view(&db)).pop() {
            eprintln!(
                "o1 Active ratio {:.3} after {grown} MiB of growth: {p:?}",
                r[0]
            );
            break p;
        }
        if r[0] < cfg.oversubscription.active_ratio && grown < 200 {
            for vm in ["w1", "w2"] {
                let f = format!("of=/tmp/grow{grown}");
                let out = cl
                    .fleet
                    .link(&vid(vm))
                    .unwrap()
                    .spawn(
                        &["dd", "if=/dev/zero", &f, "bs=1M", "count=10"],
                        Default::default(),
                    )
                    .wait(Duration::from_secs(120))
                    .unwrap();
                assert_eq!(out.status, 0, "{out:?}");
            }
            grown += 20;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "no plan; o1 ratio {:.3}, grown {grown} MiB",
            r[0]
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(plan.rule, "speculative-oversubscription");
    assert_eq!(plan.source, node("o1"));
    let dests: Vec<String> = plan.moves.iter().map(|m| m.dest.to_string()).collect();
    assert!(!plan.moves.is_empty());
    let out = run_plan(&mut db, &server, &mut cl.fleet, &plan, &cfg.barrier).expect("run_plan");
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    if plan.moves.len() == 2 {
        assert_ne!(
            dests[0], dests[1],
            "spread means one free node per VM: {dests:?}"
        );
    }
    for app in apps {
        let sum = app.finish();
        assert!(sum.contains("received=400 bad=0"), "{sum}");
    }
    for m in &plan.moves {
        assert_eq!(cl.fleet.node_of(&m.vm).unwrap(), &m.dest);
        assert_counter_continuous(&t.path(&format!("{}.console", m.vm)));
    }
    eprintln!("accelerator: {}; moved {dests:?}", cl.accel);
}
