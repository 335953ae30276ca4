//! A share as the guest's kernel sees it: a FUSE file system whose every operation is asked of
//! the host (through [`Remote`]) by path, with the node table of [`super::nodes`] in between.

use super::nodes::Nodes;
use super::proto::{Attr, FsOp, FsResult, Kind, MAX_IO, SetTime};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use std::ffi::OsStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Who answers a share's operations (the host, over the agent channel): the operation and
/// its payload (a write's data) in, the result and its payload (a read's data) out.
pub trait Remote: Send + Sync + 'static {
    fn call(&self, share: u32, op: FsOp, data: &[u8]) -> super::calls::Answer;
}

/// How long the guest's kernel may trust an answer: short, since other nodes write too.
const TTL: Duration = Duration::from_secs(1);

pub struct ShareFs {
    remote: Arc<dyn Remote>,
    share: u32,
    nodes: Mutex<Nodes>,
}

impl ShareFs {
    pub fn new(remote: Arc<dyn Remote>, share: u32) -> Self {
        ShareFs {
            remote,
            share,
            nodes: Mutex::new(Nodes::default()),
        }
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, Nodes> {
        crate::sync::lock(&self.nodes)
    }

    fn call(&self, op: FsOp) -> Result<FsResult, Errno> {
        self.call_with(op, &[]).map(|(r, _)| r)
    }

    /// An operation with a payload, or one answered with data.
    fn call_with(&self, op: FsOp, data: &[u8]) -> Result<(FsResult, Vec<u8>), Errno> {
        match self.remote.call(self.share, op, data) {
            (FsResult::Err { errno }, _) => Err(Errno::from_i32(errno)),
            r => Ok(r),
        }
    }

    /// The data an operation is answered with.
    fn data(&self, op: FsOp) -> Result<Vec<u8>, Errno> {
        match self.call_with(op, &[])? {
            (FsResult::Data, d) => Ok(d),
            _ => Err(Errno::EIO),
        }
    }

    fn path(&self, ino: INodeNo) -> Result<String, Errno> {
        self.nodes().path(ino.0).ok_or(Errno::ESTALE)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<(String, String), Errno> {
        // The protocol carries UTF-8 names (a JSON string).
        let name = name.to_str().ok_or(Errno::EINVAL)?.to_string();
        let path = self
            .nodes()
            .child_path(parent.0, &name)
            .ok_or(Errno::ESTALE)?;
        Ok((path, name))
    }

    fn attr_of(&self, op: FsOp) -> Result<Attr, Errno> {
        match self.call(op)? {
            FsResult::Attr(a) => Ok(a),
            _ => Err(Errno::EIO),
        }
    }

    /// A new entry `name` in `parent` whose attributes `op` answers.
    fn entry(&self, parent: INodeNo, name: &str, op: FsOp) -> Result<FileAttr, Errno> {
        let a = self.attr_of(op)?;
        let ino = self.nodes().lookup(parent.0, name);
        Ok(file_attr(ino, &a))
    }

    fn done(&self, op: FsOp) -> Result<(), Errno> {
        self.call(op).map(|_| ())
    }

    /// Removes `name` from `parent` with the operation `op` makes of its path.
    fn remove(&self, parent: INodeNo, name: &OsStr, op: fn(String) -> FsOp) -> Result<(), Errno> {
        let (path, name) = self.child(parent, name)?;
        self.done(op(path))?;
        self.nodes().removed(parent.0, &name);
        Ok(())
    }
}

fn time((sec, nsec): (i64, u32)) -> SystemTime {
    u64::try_from(sec).map_or(UNIX_EPOCH, |s| UNIX_EPOCH + Duration::new(s, nsec))
}

fn set_time(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(at) => {
            let d = at.duration_since(UNIX_EPOCH).unwrap_or_default();
            SetTime::At {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            }
        }
    })
}

fn kind(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::Char => FileType::CharDevice,
        Kind::Block => FileType::BlockDevice,
    }
}

fn file_attr(ino: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

/// Directory listings give a node id for every name: the kernel's own when it holds one,
/// else a stable stand-in far above the ids handed out (`ls -i` only).
fn listed_ino(nodes: &Nodes, parent: u64, name: &str) -> u64 {
    nodes.known(parent, name).unwrap_or_else(|| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes().chain(parent.to_le_bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        h | (1 << 63)
    })
}

impl fuser::Filesystem for ShareFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_IO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self
            .child(parent, name)
            .and_then(|(path, name)| self.entry(parent, &name, FsOp::Stat { path }));
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.nodes().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = self
            .path(ino)
            .and_then(|path| self.attr_of(FsOp::Stat { path }));
        match r {
            Ok(a) => reply.attr(&TTL, &file_attr(ino.0, &a)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = self.path(ino).and_then(|path| {
            let a = self.attr_of(FsOp::Setattr {
                path,
                mode,
                size,
                atime: set_time(atime),
                mtime: set_time(mtime),
            })?;
            // Files in a share belong to the job's user on the host; the guest cannot give
            // them away (as the user could not there).
            if uid.is_some_and(|u| u != a.uid) || gid.is_some_and(|g| g != a.gid) {
                return Err(Errno::EPERM);
            }
            Ok(a)
        });
        match r {
            Ok(a) => reply.attr(&TTL, &file_attr(ino.0, &a)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = self
            .path(ino)
            .and_then(|path| self.data(FsOp::Readlink { path }));
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Devices, pipes and sockets live in the guest's own file systems, not on the host.
        reply.error(Errno::EPERM);
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.child(parent, name).and_then(|(path, name)| {
            let mode = mode & !umask;
            self.entry(parent, &name, FsOp::Mkdir { path, mode })
        });
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, |path| FsOp::Unlink { path }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, |path| FsOp::Rmdir { path }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let r = self.child(parent, link_name).and_then(|(path, name)| {
            let target = target.to_str().ok_or(Errno::EINVAL)?.to_string();
            self.entry(parent, &name, FsOp::Symlink { path, target })
        });
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            if flags.contains(fuser::RenameFlags::RENAME_EXCHANGE) {
                return Err(Errno::EINVAL);
            }
            let (from, name) = self.child(parent, name)?;
            let (to, newname) = self.child(newparent, newname)?;
            let noreplace = flags.contains(fuser::RenameFlags::RENAME_NOREPLACE);
            self.done(FsOp::Rename {
                from,
                to,
                noreplace,
            })?;
            self.nodes().renamed(parent.0, &name, newparent.0, &newname);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self.path(ino).and_then(|from| {
            let (to, name) = self.child(newparent, newname)?;
            self.entry(newparent, &name, FsOp::Link { from, to })
        });
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: fuser::OpenFlags, reply: ReplyOpen) {
        // Stateless on the host: a path per operation, so nothing is left to reopen after a
        // migration. The kernel checks the mode bits itself (default_permissions).
        match self.path(ino) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let r = self
            .path(ino)
            .and_then(|path| self.data(FsOp::Read { path, offset, size }));
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = self.path(ino).and_then(|path| {
            match self.call_with(FsOp::Write { path, offset }, data)? {
                (FsResult::Written { n }, _) => Ok(n),
                _ => Err(Errno::EIO),
            }
        });
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        // Every write already reached the host before it returned.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self
            .path(ino)
            .and_then(|path| self.done(FsOp::Fsync { path }))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Offsets: 1 and 2 are `.` and `..`; host entry i is 3 + i.
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if offset < 1 && reply.add(ino, 1, FileType::Directory, ".") {
            return reply.ok();
        }
        if offset < 2 {
            let up = INodeNo(self.nodes().parent(ino.0));
            if reply.add(up, 2, FileType::Directory, "..") {
                return reply.ok();
            }
        }
        let mut from = offset.saturating_sub(2);
        loop {
            let (entries, more) = match self.call(FsOp::Readdir {
                path: path.clone(),
                from,
            }) {
                Ok(FsResult::Entries { entries, more }) => (entries, more),
                Ok(_) => return reply.error(Errno::EIO),
                Err(e) => return reply.error(e),
            };
            let nodes = self.nodes();
            for e in entries {
                let i = listed_ino(&nodes, ino.0, &e.name);
                from += 1;
                if reply.add(INodeNo(i), from + 2, kind(e.kind), &e.name) {
                    return reply.ok();
                }
            }
            if !more {
                return reply.ok();
            }
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.call(FsOp::Statfs) {
            Ok(FsResult::Statfs(s)) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Ok(_) => reply.error(Errno::EIO),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.child(parent, name).and_then(|(path, name)| {
            let excl = flags & libc::O_EXCL != 0;
            let mode = mode & !umask;
            self.entry(parent, &name, FsOp::Create { path, mode, excl })
        });
        match r {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }
}
