//! Every inode's timestamps set to the build epoch by patching the inode tables of the
//! finished ext4 image in place. `mke2fs -d` copies the host's times (and the host's ctime
//! cannot be set at all); setting them through `debugfs` took four commands per file, each a
//! path lookup and an inode-table write: over a second for a small image, more than the rest
//! of a rebuild. Here it is one pass over the inode tables. The result is what `debugfs`'s
//! `sif PATH atime|mtime|ctime|crtime @EPOCH` gives for every inode of the tree: the low 32
//! bits of each time, the epoch bits of its `_extra` word (its nanoseconds kept), and the
//! inode's checksum recomputed.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

const SUPERBLOCK: u64 = 1024;
const MAGIC: u16 = 0xEF53;
const INCOMPAT_64BIT: u32 = 0x80;
const INCOMPAT_CSUM_SEED: u32 = 0x2000;
const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
const BG_INODE_UNINIT: u16 = 0x1;
const ROOT_INO: u32 = 2;
/// `i_extra_isize` is counted from here.
const GOOD_OLD_INODE_SIZE: usize = 128;

/// `(low word, extra word)` offsets of atime, mtime, ctime and crtime in an inode.
const TIMES: [(usize, usize); 4] = [(0x08, 0x8C), (0x10, 0x88), (0x0C, 0x84), (0x90, 0x94)];
const CHECKSUM_LO: usize = 0x7C;
const EXTRA_ISIZE: usize = 0x80;
const CHECKSUM_HI: usize = 0x82;
const GENERATION: usize = 0x64;
const LINKS_COUNT: usize = 0x1A;

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not an ext4 image: {what}"),
    )
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn put_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

/// What the pass needs of the superblock.
struct Geometry {
    block: u64,
    groups: u64,
    inodes_per_group: u32,
    inode_size: usize,
    first_ino: u32,
    desc_size: usize,
    /// Where the group descriptors start.
    gdt: u64,
    /// The metadata checksum seed, when inodes carry checksums.
    csum_seed: Option<u32>,
}

fn geometry(f: &File) -> io::Result<Geometry> {
    let mut sb = [0u8; 1024];
    f.read_exact_at(&mut sb, SUPERBLOCK)?;
    if u16_at(&sb, 0x38) != MAGIC {
        return Err(bad("no superblock magic"));
    }
    let log_block = u32_at(&sb, 0x18);
    if log_block > 6 {
        return Err(bad("block size"));
    }
    let block = 1024u64 << log_block;
    let incompat = u32_at(&sb, 0x60);
    let blocks = u64::from(u32_at(&sb, 0x04))
        | if incompat & INCOMPAT_64BIT != 0 {
            u64::from(u32_at(&sb, 0x150)) << 32
        } else {
            0
        };
    let first_data = u64::from(u32_at(&sb, 0x14));
    let per_group = u64::from(u32_at(&sb, 0x20));
    let inodes_per_group = u32_at(&sb, 0x28);
    let inode_size = if u32_at(&sb, 0x4C) == 0 {
        GOOD_OLD_INODE_SIZE
    } else {
        usize::from(u16_at(&sb, 0x58))
    };
    let desc_size = if incompat & INCOMPAT_64BIT != 0 {
        usize::from(u16_at(&sb, 0xFE))
    } else {
        32
    };
    if per_group == 0 || inodes_per_group == 0 || inode_size < GOOD_OLD_INODE_SIZE || desc_size < 32
    {
        return Err(bad("group geometry"));
    }
    let csum_seed = (u32_at(&sb, 0x64) & RO_COMPAT_METADATA_CSUM != 0).then(|| {
        if incompat & INCOMPAT_CSUM_SEED != 0 {
            u32_at(&sb, 0x270)
        } else {
            crc32c(!0, &sb[0x68..0x78])
        }
    });
    Ok(Geometry {
        block,
        groups: blocks.saturating_sub(first_data).div_ceil(per_group),
        inodes_per_group,
        inode_size,
        first_ino: u32_at(&sb, 0x54).max(11),
        desc_size,
        gdt: (first_data + 1) * block,
        csum_seed,
    })
}

/// Sets every tree inode's times in the ext4 image `f` to `epoch` (the root directory and
/// every inode in use from the first non-reserved one on; the journal and the other reserved
/// inodes are not files of the tree). Writes only the inode tables that changed.
pub(super) fn stamp_times(f: &File, epoch: u64) -> io::Result<()> {
    let g = geometry(f)?;
    let low = epoch as u32;
    // ext4 keeps bits 32-33 of a time in the low bits of its `_extra` word.
    let high = ((epoch >> 32) & 3) as u32;
    let mut descs = vec![0u8; g.groups as usize * g.desc_size];
    f.read_exact_at(&mut descs, g.gdt)?;
    for group in 0..g.groups as usize {
        let d = &descs[group * g.desc_size..(group + 1) * g.desc_size];
        if u16_at(d, 0x12) & BG_INODE_UNINIT != 0 {
            continue;
        }
        let hi = |o: usize| {
            if g.desc_size >= 64 {
                u64::from(u32_at(d, o)) << 32
            } else {
                0
            }
        };
        let bitmap_at = (u64::from(u32_at(d, 0x04)) | hi(0x24)) * g.block;
        let table_at = (u64::from(u32_at(d, 0x08)) | hi(0x28)) * g.block;
        let mut bitmap = vec![0u8; (g.inodes_per_group as usize).div_ceil(8)];
        f.read_exact_at(&mut bitmap, bitmap_at)?;
        let mut table = vec![0u8; g.inodes_per_group as usize * g.inode_size];
        f.read_exact_at(&mut table, table_at)?;
        let mut changed = false;
        for i in 0..g.inodes_per_group {
            let ino = group as u32 * g.inodes_per_group + i + 1;
            let used = bitmap[i as usize / 8] & (1 << (i % 8)) != 0;
            if !used || (ino != ROOT_INO && ino < g.first_ino) {
                continue;
            }
            let at = i as usize * g.inode_size;
            let inode = &mut table[at..at + g.inode_size];
            if u16_at(inode, LINKS_COUNT) == 0 {
                continue;
            }
            changed |= stamp_inode(inode, ino, low, high, g.csum_seed);
        }
        if changed {
            f.write_all_at(&table, table_at)?;
        }
    }
    Ok(())
}

/// One inode's times; whether it changed.
fn stamp_inode(inode: &mut [u8], ino: u32, low: u32, high: u32, seed: Option<u32>) -> bool {
    // Fields past 128 bytes exist only as far as `i_extra_isize` reaches.
    let extra = if inode.len() > GOOD_OLD_INODE_SIZE {
        usize::from(u16_at(inode, EXTRA_ISIZE))
    } else {
        0
    };
    let len = inode.len();
    let has = |o: usize| o + 4 <= GOOD_OLD_INODE_SIZE + extra && o + 4 <= len;
    let before = inode.to_vec();
    for (lo, ex) in TIMES {
        if !has(lo) {
            continue;
        }
        put_u32(inode, lo, low);
        if has(ex) {
            let v = u32_at(inode, ex);
            put_u32(inode, ex, (v & !3) | high);
        }
    }
    if inode == before.as_slice() {
        return false;
    }
    if let Some(seed) = seed {
        // `i_checksum_hi` is the first field past `i_extra_isize`.
        let has_hi = extra >= 4;
        put_u16(inode, CHECKSUM_LO, 0);
        if has_hi {
            put_u16(inode, CHECKSUM_HI, 0);
        }
        let mut crc = crc32c(seed, &ino.to_le_bytes());
        crc = crc32c(crc, &u32_at(inode, GENERATION).to_le_bytes());
        crc = crc32c(crc, inode);
        put_u16(inode, CHECKSUM_LO, crc as u16);
        if has_hi {
            put_u16(inode, CHECKSUM_HI, (crc >> 16) as u16);
        }
    }
    true
}

/// CRC-32C as ext4 uses it: no inversion in or out (`ext2fs_crc32c_le`).
fn crc32c(mut crc: u32, data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (n, e) in t.iter_mut().enumerate() {
            let mut c = n as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    for &b in data {
        crc = t[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::crc32c;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The standard CRC-32C of "123456789" is 0xE3069283 (inverted in and out).
        assert_eq!(!crc32c(!0, b"123456789"), 0xE306_9283);
    }
}
