//! QMP replies as the QEMU plugin reads them: a fake QEMU (a unix socket in a run directory
//! that `Plugin::attach` finds: profile.json, vm.json naming a live pid, qmp.sock) sends the
//! fuzzer's bytes; attaching reads the greeting, negotiates capabilities and queries the
//! status, then `Vm::status` queries again. Events between replies, error objects, over-long
//! lines and garbage all come from the fuzzer. Errors are fine; panics and hangs are not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;
use v2m::qemu::{Accel, AccelChoice, QemuConfig, QemuPlugin};
use v2m::{ImageRef, Plugin, Profile, VmName};

struct Env {
    _dir: tempfile::TempDir,
    run_root: PathBuf,
    name: VmName,
    sock: PathBuf,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        vse_fuzz::ignore_sigpipe();
        let dir = tempfile::Builder::new()
            .prefix("vse-qmp-")
            .tempdir()
            .expect("tempdir");
        let run_root = dir.path().join("run");
        let name = VmName::try_from("fuzzvm".to_string()).expect("name");
        let vm_dir = run_root.join(name.as_str());
        std::fs::create_dir_all(&vm_dir).expect("run dir");
        let profile = Profile::new(
            name.clone(),
            1,
            64,
            ImageRef {
                kernel: "/nonexistent/vmlinuz".into(),
                initrd: None,
                root_disk: None,
                cmdline: String::new(),
            },
        );
        std::fs::write(vm_dir.join("profile.json"), profile.to_json()).expect("profile");
        let accel = AccelChoice {
            accel: Accel::Tcg,
            reason: "fuzz".into(),
            detail: String::new(),
        };
        // A live pid (this process) makes attach connect to QMP; the VM is not owned, so
        // nothing is ever signalled.
        let meta = serde_json::json!({"pid": std::process::id(), "accel": accel, "incoming": null});
        std::fs::write(vm_dir.join("vm.json"), meta.to_string()).expect("meta");
        let sock = vm_dir.join("qmp.sock");
        Env {
            _dir: dir,
            run_root,
            name,
            sock,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let e = env();
    let _ = std::fs::remove_file(&e.sock);
    let listener = UnixListener::bind(&e.sock).expect("bind qmp.sock");
    let script = data.to_vec();
    let qemu = std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        let _ = s.write_all(&script);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let cfg = QemuConfig {
        run_root: e.run_root.clone(),
        qmp_timeout: Duration::from_secs(5),
        ..QemuConfig::default()
    };
    let plugin = QemuPlugin::new(cfg);
    if let Ok(mut vm) = plugin.attach(&e.name) {
        for _ in 0..3 {
            if vm.status().is_err() {
                break;
            }
        }
    }
    // Unblocks the fake QEMU if attach never connected.
    let _ = std::os::unix::net::UnixStream::connect(&e.sock);
    qemu.join().expect("fake qemu");
});
