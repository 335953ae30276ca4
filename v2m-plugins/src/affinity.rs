//! Thread affinity through `sched_setaffinity`/`sched_getaffinity` (per thread id, which is
//! what Linux applies them to).

use std::io;

pub fn set_affinity(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set, CPU_SET writes within it for
    // indices below CPU_SETSIZE (checked), and the syscall only reads the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("CPU {c} out of range"),
                ));
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

pub fn get_affinity(tid: i32) -> io::Result<Vec<usize>> {
    // SAFETY: the kernel writes at most size_of::<cpu_set_t>() bytes into `set`; CPU_ISSET reads
    // within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect())
    }
}

/// Thread ids of a process (its `/proc/PID/task` entries).
pub fn threads_of(pid: u32) -> io::Result<Vec<i32>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        if let Ok(t) = e?.file_name().to_string_lossy().parse() {
            out.push(t);
        }
    }
    Ok(out)
}
