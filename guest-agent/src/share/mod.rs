//! Host directories in the guest ("shares"): the guest mounts each as a FUSE file system
//! whose operations travel over the agent channel to the host end, which does them inside
//! the shared directory as the job's user. See ARCHITECTURE.md ("Shares") for why this and
//! not 9p, virtio-fs or NFS.

pub mod calls;
pub mod fs;
pub mod mount;
pub mod nodes;
pub mod proto;
pub mod server;
