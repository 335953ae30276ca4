//! imgbuild: turns a locked package set into a bootable, hypervisor-agnostic VSE image:
//! fetch (content-addressed cache), unpack (path-safe), configure (the image's own dpkg),
//! customise (spec and policy), initramfs (virtio + Xen drivers), raw ext4 root disk,
//! optional qcow2 and tar.gz, and a manifest with the SHA256 of every part (the manifest's
//! model lives in `vse-image`, with the image directory readers open).
//!
//! The input is a [`plan::BuildPlan`], not the lockfile itself, so this crate does not
//! depend on the resolver for building; [`pipeline`] is the spec → lock → image path that
//! converts a `vsec::lock::Lockfile` into a plan and builds it.

pub mod accounts;
pub mod aptplan;
pub mod build;
pub mod customize;
pub mod deb;
pub mod disk;
pub mod fetch;
pub mod from_lock;
pub mod guard;
pub mod import;
pub mod initramfs;
pub mod layers;
pub mod pipeline;
pub mod plan;
pub mod progress;
pub mod rootfs;
pub mod rootless;
pub mod tarball;
