//! The guest agent. As PID 1 (the initramfs hands over to it) it mounts the kernel
//! filesystems first and starts reaping orphans; then it finds its virtio-serial port by
//! name and serves the host.
//! It never exits as PID 1: a lost channel is retried, `shutdown` powers off.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::path::PathBuf;
use vse_guest_agent::protocol::{GUEST_BARRIER_SOCKET, PORT_NAME};

fn mount(src: &str, target: &str, fstype: &str) {
    let _ = std::fs::create_dir_all(target);
    let (s, t, f) = (
        CString::new(src).unwrap_or_default(),
        CString::new(target).unwrap_or_default(),
        CString::new(fstype).unwrap_or_default(),
    );
    // SAFETY: valid C strings; failure (already mounted) is harmless.
    unsafe {
        libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), 0, std::ptr::null());
    }
}

/// `/dev/vportNpM` whose sysfs name is [`PORT_NAME`].
fn find_port() -> Option<PathBuf> {
    for e in std::fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if name.trim() == PORT_NAME {
            return Some(PathBuf::from("/dev").join(e.file_name()));
        }
    }
    None
}

fn power_off() {
    // SAFETY: plain syscalls.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
}

fn main() {
    // Multi-call: `vse-agent rsh HOST CMD...` is Open MPI's rsh agent inside the VMs.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("rsh") {
        std::process::exit(vse_guest_agent::rsh::client_main(&args[2..]));
    }
    let pid1 = std::process::id() == 1;
    if pid1 {
        mount("proc", "/proc", "proc");
        mount("sysfs", "/sys", "sysfs");
        mount("devtmpfs", "/dev", "devtmpfs");
        mount("devpts", "/dev/pts", "devpts");
        mount("tmpfs", "/run", "tmpfs");
        mount("tmpfs", "/tmp", "tmpfs");
        let preload = std::path::Path::new(vse_guest_agent::preload::GUEST_PRELOAD);
        if let Err(e) = vse_guest_agent::preload::install(preload) {
            eprintln!(
                "vse-agent: no MPI barrier hook ({}): {e}",
                preload.display()
            );
        }
        // SAFETY: setting the PATH for children before any thread exists.
        unsafe {
            std::env::set_var(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            );
            std::env::set_var("HOME", "/root");
        }
        // Before the first command: from here on only the reaper waits for children.
        if let Err(e) = vse_guest_agent::reaper::install() {
            eprintln!("vse-agent: no reaper, orphans will stay zombies: {e}");
        }
    }
    let hub = vse_guest_agent::hub::Hub::new();
    // Ranks find the relay here (VSE_BARRIER_SOCKET); without /run the relay is off, the
    // agent still serves commands.
    if let Err(e) = hub.listen(std::path::Path::new(GUEST_BARRIER_SOCKET)) {
        eprintln!("vse-agent: barrier relay off ({GUEST_BARRIER_SOCKET}): {e}");
    }
    loop {
        let Some(port) = find_port() else {
            eprintln!("vse-agent: no virtio-serial port named {PORT_NAME}; retrying");
            std::thread::sleep(std::time::Duration::from_millis(200));
            continue;
        };
        match OpenOptions::new().read(true).write(true).open(&port) {
            Ok(f) => {
                let Ok(w) = f.try_clone() else { continue };
                if let Err(e) = vse_guest_agent::serve::serve(f, w, &power_off, &hub) {
                    eprintln!("vse-agent: {}: {e}", port.display());
                }
            }
            Err(e) => eprintln!("vse-agent: cannot open {}: {e}", port.display()),
        }
        if !pid1 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
