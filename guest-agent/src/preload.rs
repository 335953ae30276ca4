//! The MPI_Barrier hook for a job's MPI ranks (`preload/vse_barrier_mpi.c`, compiled by this
//! crate's build script), carried inside the agent so that every image — built, imported, of
//! any distribution — has it without a package or a rebuild: the agent writes it to a tmpfs
//! at boot, and `vse launch --mpi` has mpirun preload it into the ranks.

/// Where the agent puts the library in the guest.
pub const GUEST_PRELOAD: &str = "/run/vse-barrier-mpi.so";

/// The library's bytes.
pub const LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libvse-barrier-mpi.so"));

/// Writes the library to `path` (readable by all, writable by root only), replacing any
/// file there atomically so a rank never maps a half-written library.
pub fn install(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, LIBRARY)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path)
}
