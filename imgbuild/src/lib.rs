//! imgbuild
