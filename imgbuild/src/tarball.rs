//! The rootfs as `tar.gz` (for container runtimes and inspection): sorted entries, the
//! recorded owners and modes, one mtime, gzip without a timestamp, so it is reproducible.

use crate::deb::{Kind, Records};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub fn write_tar_gz(root: &Path, records: &Records, out: &Path, epoch: u64) -> std::io::Result<()> {
    let file = std::fs::File::create(out)?;
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(std::io::BufWriter::new(file), flate2::Compression::new(6));
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    let mut stack = vec![String::new()];
    let mut paths = Vec::new();
    while let Some(rel) = stack.pop() {
        let host = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&rel)
        };
        let md = std::fs::symlink_metadata(&host)?;
        if md.is_dir() {
            let mut kids: Vec<String> = std::fs::read_dir(&host)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<Result<_, _>>()?;
            kids.sort();
            for k in kids.into_iter().rev() {
                stack.push(if rel.is_empty() {
                    k
                } else {
                    format!("{rel}/{k}")
                });
            }
        }
        paths.push((rel, md));
    }
    for (rel, md) in paths {
        let image_path = format!("/{rel}");
        let rec = records.get(&image_path);
        let mut h = tar::Header::new_gnu();
        h.set_metadata_in_mode(&md, tar::HeaderMode::Deterministic);
        h.set_mtime(epoch);
        h.set_uid(rec.map_or(0, |r| r.uid) as u64);
        h.set_gid(rec.map_or(0, |r| r.gid) as u64);
        let perm = rec
            .filter(|r| r.kind != Kind::Symlink)
            .map_or(md.mode() & 0o7777, |r| r.perm);
        h.set_mode(perm);
        let name = if rel.is_empty() {
            "./".to_string()
        } else {
            format!("./{rel}")
        };
        let host = root.join(&rel);
        if md.file_type().is_symlink() {
            let target = std::fs::read_link(&host)?;
            h.set_size(0);
            tar.append_link(&mut h, &name, &target)?;
        } else if md.is_file() {
            tar.append_data(&mut h, &name, std::fs::File::open(&host)?)?;
        } else {
            h.set_size(0);
            tar.append_data(&mut h, &name, std::io::empty())?;
        }
    }
    for (path, r) in records {
        let (ty, major, minor) = match r.kind {
            Kind::CharDev { major, minor } => (tar::EntryType::Char, major, minor),
            Kind::BlockDev { major, minor } => (tar::EntryType::Block, major, minor),
            Kind::Fifo => (tar::EntryType::Fifo, 0, 0),
            _ => continue,
        };
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(ty);
        h.set_device_major(major)?;
        h.set_device_minor(minor)?;
        h.set_mode(r.perm);
        h.set_uid(r.uid as u64);
        h.set_gid(r.gid as u64);
        h.set_mtime(epoch);
        h.set_size(0);
        tar.append_data(&mut h, format!(".{path}"), std::io::empty())?;
    }
    let gz = tar.into_inner()?;
    let w = gz.finish()?;
    w.into_inner().map_err(|e| e.into_error())?.sync_all()
}
