//! The guest program of the migration scenario tests: a message-passing loop that checks
//! every message and calls the barrier hook at every step, as an MPI program's `MPI_Barrier`
//! would. A sender thread writes numbered, checksummed messages into a kernel pipe; the main
//! thread receives and checks each one (order, no gap, no duplicate, payload intact). Live
//! migration moves the whole VM, pipe buffers included, so any loss or duplication shows.
//!
//! Usage: `vse-msgcheck STEPS DELAY_MS` (installed as /bin/msgcheck in the test guest). Prints one summary line:
//! `MSGCHECK steps=N received=N bad=0 migrated=M released=R checks=C`, exit 0 when all is well.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;

fn checksum(seq: u64) -> u64 {
    seq.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17) ^ 0xa5a5_a5a5
}

fn pipe() -> (std::fs::File, std::fs::File) {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-element array; the fds are owned by the Files below.
    let rc = unsafe { libc_pipe(fds.as_mut_ptr()) };
    assert_eq!(rc, 0, "pipe() failed");
    // SAFETY: fresh descriptors from pipe(2), each owned exactly once.
    unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    }
}

unsafe extern "C" {
    #[link_name = "pipe"]
    fn libc_pipe(fds: *mut i32) -> i32;
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let steps: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100);
    let delay =
        std::time::Duration::from_millis(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(50));
    let (rx, mut tx) = pipe();
    let (go_tx, go_rx) = std::sync::mpsc::sync_channel::<u64>(0);
    let sender = std::thread::spawn(move || {
        for seq in go_rx {
            let _ = writeln!(tx, "{seq} {}", checksum(seq));
        }
    });
    let mut lines = BufReader::new(rx).lines();
    let (mut received, mut bad, mut migrated, mut released) = (0u64, 0u64, 0u64, 0u64);
    let mut expected = 0u64;
    for step in 0..steps {
        match vse_barrier::vse_barrier_check() {
            vse_barrier::MIGRATED => {
                migrated += 1;
                println!("MIGRATED at step {step}");
            }
            vse_barrier::RELEASED => released += 1,
            vse_barrier::ERROR => {
                // SAFETY: the library returns null or a valid C string.
                let msg = unsafe {
                    let p = vse_barrier::vse_barrier_last_error();
                    if p.is_null() {
                        String::new()
                    } else {
                        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
                    }
                };
                eprintln!("barrier error at step {step}: {msg}");
                std::process::exit(3);
            }
            _ => {}
        }
        if go_tx.send(step).is_err() {
            break;
        }
        let Some(Ok(line)) = lines.next() else {
            break;
        };
        let mut parts = line.split_whitespace().map(|p| p.parse::<u64>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(seq), Some(sum)) if seq == expected && sum == checksum(seq) => {
                received += 1;
                expected += 1;
            }
            _ => {
                bad += 1;
                eprintln!("bad message at step {step}: {line:?} (expected seq {expected})");
            }
        }
        std::thread::sleep(delay);
    }
    drop(go_tx);
    let _ = sender.join();
    let mut checks: std::ffi::c_ulong = 0;
    // SAFETY: valid pointer to a c_ulong; the other is null (skipped).
    unsafe { vse_barrier::vse_barrier_stats(&mut checks, std::ptr::null_mut()) };
    println!(
        "MSGCHECK steps={steps} received={received} bad={bad} migrated={migrated} released={released} checks={checks}"
    );
    std::process::exit(if received == steps && bad == 0 { 0 } else { 1 });
}
