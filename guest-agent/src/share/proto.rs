//! The share protocol: file operations the guest's FUSE mounts send to the host (in
//! [`crate::protocol::Message::Fs`]) and their results (in
//! [`crate::protocol::Request::FsReply`]).
//!
//! Every operation names its file by a path relative to the share's root, never by a handle
//! the host keeps: any host end can answer it (a migration's destination, or a restore's
//! node), so the guest's view of its shares is all the state there is, and it lives in the
//! guest's memory, which migrates and is checkpointed with the VM.
//!
//! File data travels raw, after the JSON line that announces its length (`bytes`), not in
//! the line: no hex, no JSON scanning of the data, on a channel whose every byte costs (a VM
//! exit per 32 KiB of virtio-serial writes; each instruction is emulated under TCG).

/// One share a guest mounts: `id` is what its operations name, `guest` the mount point.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MountShare {
    pub id: u32,
    pub guest: String,
    #[serde(default)]
    pub ro: bool,
}

/// A time to set: seconds and nanoseconds since the epoch, or the host's "now".
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SetTime {
    Now,
    At { sec: i64, nsec: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "fs", rename_all = "kebab-case")]
pub enum FsOp {
    /// `lstat`; `path` "" is the share's root.
    Stat {
        path: String,
    },
    Setattr {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        atime: Option<SetTime>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mtime: Option<SetTime>,
    },
    Readlink {
        path: String,
    },
    /// Entries from index `from` on (at most [`MAX_DIR_ENTRIES`]), `.` and `..` left out.
    Readdir {
        path: String,
        from: u64,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    /// A new regular file (`excl`: fail when it exists).
    Create {
        path: String,
        mode: u32,
        excl: bool,
    },
    Symlink {
        path: String,
        target: String,
    },
    Link {
        from: String,
        to: String,
    },
    Unlink {
        path: String,
    },
    Rmdir {
        path: String,
    },
    Rename {
        from: String,
        to: String,
        #[serde(default)]
        noreplace: bool,
    },
    Read {
        path: String,
        offset: u64,
        size: u32,
    },
    /// The data is the message's payload.
    Write {
        path: String,
        offset: u64,
    },
    Fsync {
        path: String,
    },
    Statfs,
}

impl FsOp {
    /// Whether the operation changes the share (refused on a read-only one).
    pub fn writes(&self) -> bool {
        !matches!(
            self,
            FsOp::Stat { .. }
                | FsOp::Readlink { .. }
                | FsOp::Readdir { .. }
                | FsOp::Read { .. }
                | FsOp::Statfs
        )
    }
}

/// Largest read or write of one operation (the FUSE mount's `max_write` and `max_read`).
pub const MAX_IO: u32 = 128 * 1024;
/// Most directory entries in one `Readdir` answer.
pub const MAX_DIR_ENTRIES: usize = 512;
/// Largest payload either side accepts: one operation's data, or a link's target.
pub const MAX_PAYLOAD: u32 = MAX_IO + 8192;

/// FNV-1a of a payload: an answer's payload is checked with it in the guest, which may see
/// the end of one host end's payload run into the next end's bytes at a switchover.
pub fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Serde's `skip_serializing_if` for counts that are usually zero.
pub fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Char,
    Block,
}

impl Kind {
    pub fn from_mode(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::Char,
            libc::S_IFBLK => Kind::Block,
            _ => Kind::File,
        }
    }
}

/// What `lstat` says of a file, as the guest needs it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attr {
    pub kind: Kind,
    pub perm: u16,
    pub size: u64,
    pub blocks: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    /// Seconds and nanoseconds since the epoch.
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FsStat {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "r", rename_all = "kebab-case")]
pub enum FsResult {
    Done,
    Attr(Attr),
    /// The data (a read's, a link's target) is the answer's payload.
    Data,
    Entries {
        entries: Vec<DirEntry>,
        more: bool,
    },
    Written {
        n: u32,
    },
    Statfs(FsStat),
    /// A positive `errno`, as the host's call failed (or as the share's rules refuse).
    Err {
        errno: i32,
    },
}
