//! A cpio "newc" writer (the format the kernel unpacks an initramfs from). Entries are
//! written in the order given with fixed inode numbers, owner 0 and one mtime, so the same
//! input gives the same bytes.

use std::io::{self, Write};

pub enum Body<'a> {
    Dir,
    File(&'a [u8]),
    Symlink(&'a str),
}

pub struct CpioWriter<W: Write> {
    out: W,
    ino: u32,
    mtime: u32,
}

impl<W: Write> CpioWriter<W> {
    pub fn new(out: W, mtime: u64) -> Self {
        CpioWriter {
            out,
            ino: 1,
            mtime: mtime.min(u32::MAX as u64) as u32,
        }
    }

    /// `name` without a leading slash (`bin/busybox`); `perm` are the permission bits.
    pub fn add(&mut self, name: &str, perm: u32, body: Body<'_>) -> io::Result<()> {
        let (kind, data): (u32, &[u8]) = match body {
            Body::Dir => (0o040000, &[]),
            Body::File(d) => (0o100000, d),
            Body::Symlink(t) => (0o120000, t.as_bytes()),
        };
        let nlink = if matches!(body_kind(kind), "dir") {
            2
        } else {
            1
        };
        self.entry(name, kind | (perm & 0o7777), nlink, data)?;
        self.ino += 1;
        Ok(())
    }

    fn entry(&mut self, name: &str, mode: u32, nlink: u32, data: &[u8]) -> io::Result<()> {
        let namesize = name.len() + 1;
        write!(
            self.out,
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            nlink,
            self.mtime,
            data.len(),
            0,
            0,
            0,
            0,
            namesize,
            0
        )?;
        self.out.write_all(name.as_bytes())?;
        self.out.write_all(&[0])?;
        self.pad(110 + namesize)?;
        self.out.write_all(data)?;
        self.pad(data.len())
    }

    fn pad(&mut self, len: usize) -> io::Result<()> {
        let n = (4 - len % 4) % 4;
        self.out.write_all(&[0u8; 3][..n])
    }

    /// Writes the trailer and returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.ino = 0;
        self.mtime = 0;
        self.entry("TRAILER!!!", 0, 1, &[])?;
        Ok(self.out)
    }
}

fn body_kind(kind: u32) -> &'static str {
    if kind == 0o040000 { "dir" } else { "other" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_cpio_reads_what_we_write() {
        testkit::require!(testkit::tool("cpio"));
        let mut w = CpioWriter::new(Vec::new(), 1_700_000_000);
        w.add("bin", 0o755, Body::Dir).unwrap();
        w.add("bin/hello", 0o755, Body::File(b"#!/bin/sh\necho hi\n"))
            .unwrap();
        w.add("bin/sh", 0o777, Body::Symlink("busybox")).unwrap();
        let bytes = w.finish().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("cpio")
            .args(["-i", "-d", "--quiet"])
            .current_dir(dir.path())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(
            std::fs::read(dir.path().join("bin/hello")).unwrap(),
            b"#!/bin/sh\necho hi\n"
        );
        assert_eq!(
            std::fs::read_link(dir.path().join("bin/sh"))
                .unwrap()
                .to_str(),
            Some("busybox")
        );
    }
}
