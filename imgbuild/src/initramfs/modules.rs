//! Kernel module dependencies, read from each module's `.modinfo` ELF section (`depends=`),
//! so no host kmod/depmod is needed. Modules listed in `modules.builtin` need no loading.

use crate::rootfs::inroot::{InRoot, Kind};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a valid kernel module: {reason}")]
    Elf { path: PathBuf, reason: String },
    #[error(
        "kernel {kver} has no module {module:?} and does not build it in; hint: this kernel cannot drive {module}"
    )]
    Missing { kver: String, module: String },
}

/// `virtio-blk` and `virtio_blk` are the same module to the kernel.
fn canon(name: &str) -> String {
    name.replace('-', "_")
}

/// The modules of one kernel tree (`usr/lib/modules/<kver>` of an image root), by their
/// root-relative paths (read through [`InRoot`]: no link leads out of the root).
pub struct ModuleTree {
    kver: String,
    files: BTreeMap<String, String>,
    builtin: BTreeSet<String>,
}

impl ModuleTree {
    pub fn scan(root: &InRoot, dir: &str, kver: &str) -> Result<Self, ModuleError> {
        let mut files = BTreeMap::new();
        let mut stack = vec![format!("{dir}/kernel")];
        while let Some(d) = stack.pop() {
            let Ok(entries) = root.read_dir(&d) else {
                continue;
            };
            for (name, kind) in entries {
                let p = format!("{d}/{}", name.to_string_lossy());
                if kind == Kind::Dir {
                    stack.push(p);
                } else if let Some(stem) = module_stem(Path::new(&p)) {
                    files.insert(canon(&stem), p);
                }
            }
        }
        let builtin = root
            .read(&format!("{dir}/modules.builtin"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| module_stem(Path::new(l)))
            .map(|s| canon(&s))
            .collect();
        Ok(ModuleTree {
            kver: kver.into(),
            files,
            builtin,
        })
    }

    pub fn is_builtin(&self, name: &str) -> bool {
        self.builtin.contains(&canon(name))
    }

    pub fn has(&self, name: &str) -> bool {
        self.files.contains_key(&canon(name)) || self.is_builtin(name)
    }

    /// Module files to load for `wanted`, dependencies first. Built-in ones are skipped;
    /// `optional` ones absent from this kernel are skipped too.
    pub fn closure(
        &self,
        root: &InRoot,
        wanted: &[&str],
        optional: &[&str],
    ) -> Result<Vec<(String, String)>, ModuleError> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for w in wanted.iter().chain(optional) {
            if !self.has(w) {
                if optional.contains(w) {
                    continue;
                }
                return Err(ModuleError::Missing {
                    kver: self.kver.clone(),
                    module: w.to_string(),
                });
            }
            self.visit(root, &canon(w), &mut seen, &mut out)?;
        }
        Ok(out)
    }

    fn visit(
        &self,
        root: &InRoot,
        name: &str,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<(String, String)>,
    ) -> Result<(), ModuleError> {
        if !seen.insert(name.to_string()) {
            return Ok(());
        }
        let Some(path) = self.files.get(name) else {
            return Ok(()); // built in
        };
        for dep in depends(root, path)? {
            self.visit(root, &canon(&dep), seen, out)?;
        }
        out.push((name.to_string(), path.clone()));
        Ok(())
    }
}

fn module_stem(p: &Path) -> Option<String> {
    let n = p.file_name()?.to_str()?;
    n.strip_suffix(".ko")
        .or_else(|| n.strip_suffix(".ko.xz"))
        .or_else(|| n.strip_suffix(".ko.zst"))
        .map(str::to_string)
}

/// Reads a module, decompressing `.ko.xz`/`.ko.zst` (newer Debian kernels).
pub fn read_module(root: &InRoot, path: &str) -> Result<Vec<u8>, ModuleError> {
    let io = |source| ModuleError::Io {
        path: root.display(path),
        source,
    };
    let raw = root.read(path).map_err(io)?;
    let name = path;
    let mut out = Vec::new();
    if name.ends_with(".xz") {
        xz2::read::XzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(io)?;
    } else if name.ends_with(".zst") {
        out = zstd::stream::decode_all(&raw[..]).map_err(io)?;
    } else {
        out = raw;
    }
    Ok(out)
}

/// The `depends=` list of a module's `.modinfo` section.
fn depends(root: &InRoot, path: &str) -> Result<Vec<String>, ModuleError> {
    let data = read_module(root, path)?;
    let bad = |reason: &str| ModuleError::Elf {
        path: root.display(path),
        reason: reason.into(),
    };
    let u = |off: usize, len: usize| -> Result<u64, ModuleError> {
        let b = data
            .get(off..off + len)
            .ok_or_else(|| bad("truncated header"))?;
        let mut v = [0u8; 8];
        v[..len].copy_from_slice(b);
        Ok(u64::from_le_bytes(v))
    };
    if data.get(..5) != Some(b"\x7fELF\x02") {
        return Err(bad("not a 64-bit ELF file"));
    }
    let shoff = u(0x28, 8)? as usize;
    let shentsize = u(0x3a, 2)? as usize;
    let shnum = u(0x3c, 2)? as usize;
    let shstrndx = u(0x3e, 2)? as usize;
    let sh = |i: usize| shoff + i * shentsize;
    let stroff = u(sh(shstrndx) + 0x18, 8)? as usize;
    for i in 0..shnum {
        let name_off = u(sh(i), 4)? as usize;
        let name = data
            .get(stroff + name_off..)
            .and_then(|s| s.split(|b| *b == 0).next())
            .unwrap_or_default();
        if name != b".modinfo" {
            continue;
        }
        let off = u(sh(i) + 0x18, 8)? as usize;
        let size = u(sh(i) + 0x20, 8)? as usize;
        let sec = data
            .get(off..off + size)
            .ok_or_else(|| bad(".modinfo out of bounds"))?;
        for kv in sec.split(|b| *b == 0) {
            if let Some(v) = kv.strip_prefix(b"depends=") {
                return Ok(String::from_utf8_lossy(v)
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect());
            }
        }
        return Ok(Vec::new());
    }
    Err(bad("no .modinfo section"))
}
