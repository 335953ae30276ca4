//! vse-guest-agent: the agent baked into every VSE image (binary) and the host↔guest
//! protocol with its host-side client (library). The channel is a virtio-serial port named
//! [`protocol::PORT_NAME`]; no network or ssh is needed to control a VM.

pub mod client;
pub mod hub;
pub mod protocol;
pub mod serve;

pub use client::{Client, ClientError, ExecOutput};

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn runs_commands_and_reports_status_and_output() {
        let (host, guest) = UnixStream::pair().unwrap();
        let g2 = guest.try_clone().unwrap();
        let hub = hub::Hub::new();
        let t = std::thread::spawn(move || serve::serve(guest, g2, &|| {}, &hub));
        let mut c = Client::connect(host.try_clone().unwrap(), host).unwrap();
        let out = c
            .exec(&["sh", "-c", "echo out; echo err >&2; exit 3"])
            .unwrap();
        assert_eq!(out.status, 3);
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.stderr, "err\n");
        let e = c.exec(&["/nonexistent/prog"]).unwrap_err();
        assert!(
            e.to_string().contains("cannot run /nonexistent/prog"),
            "{e}"
        );
        let (mem, stat) = c.sample().unwrap();
        assert!(mem.contains("MemTotal:") && stat.starts_with("cpu "));
        c.shutdown().unwrap();
        drop(c);
        t.join().unwrap().unwrap();
    }
}
