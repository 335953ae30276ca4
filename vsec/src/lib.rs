//! vsec
