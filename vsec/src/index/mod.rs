//! Debian control-file data: the deb822 stanza format and the `Packages` index built on it.

pub mod deb822;
pub mod packages;

pub use deb822::{Deb822Error, Stanza, parse_stanzas};
pub use packages::{IndexError, MultiArch, Package, PackagesIndex, Priority};
