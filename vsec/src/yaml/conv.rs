//! From spanned raw YAML values to validated typed values, collecting every problem instead
//! of stopping at the first.

use super::{At, Diagnostic, Diagnostics, SrcPos, pos_of};
use crate::units::ValueError;
use std::sync::Arc;

/// A validated value and where it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Loc<T> {
    pub value: T,
    pub at: SrcPos,
}

/// Conversion context for one file.
pub struct Ctx {
    pub file: Arc<str>,
    pub diags: Diagnostics,
}

impl Ctx {
    pub fn new(file: &Arc<str>) -> Self {
        Ctx {
            file: Arc::clone(file),
            diags: Diagnostics::default(),
        }
    }

    pub fn pos<T>(&self, at: &At<T>) -> SrcPos {
        pos_of(&self.file, at)
    }

    /// Records a problem at `at` for the field `field`.
    pub fn error(&mut self, at: SrcPos, field: &str, e: ValueError) {
        let mut d = Diagnostic::new(at, format!("{field}: {}", e.message));
        d.hint = e.hint;
        self.diags.push(d);
    }

    /// Parses a string field; on failure records the problem and yields `None`.
    pub fn parse<T>(
        &mut self,
        raw: &At<String>,
        field: &str,
        f: impl FnOnce(&str) -> Result<T, ValueError>,
    ) -> Option<Loc<T>> {
        let at = self.pos(raw);
        match f(&raw.value) {
            Ok(value) => Some(Loc { value, at }),
            Err(e) => {
                self.error(at, field, e);
                None
            }
        }
    }

    /// Like [`Ctx::parse`] for an optional field.
    pub fn parse_opt<T>(
        &mut self,
        raw: &Option<At<String>>,
        field: &str,
        f: impl FnOnce(&str) -> Result<T, ValueError>,
    ) -> Option<Loc<T>> {
        raw.as_ref().and_then(|r| self.parse(r, field, f))
    }

    /// A plain (already typed by serde) value with its position.
    pub fn loc<T: Clone>(&self, raw: &At<T>) -> Loc<T> {
        Loc {
            value: raw.value.clone(),
            at: self.pos(raw),
        }
    }

    /// Checks a numeric range, recording a problem when outside.
    pub fn range(&mut self, raw: &At<u32>, field: &str, min: u32, max: u32) -> Option<Loc<u32>> {
        if (min..=max).contains(&raw.value) {
            Some(self.loc(raw))
        } else {
            let at = self.pos(raw);
            self.error(
                at,
                field,
                ValueError::new(format!("{} is out of range", raw.value))
                    .hint(format!("expected a number from {min} to {max}")),
            );
            None
        }
    }

    /// A fraction in (0, 1].
    pub fn fraction(&mut self, raw: &At<f64>, field: &str) -> Option<Loc<f64>> {
        if raw.value > 0.0 && raw.value <= 1.0 {
            Some(self.loc(raw))
        } else {
            let at = self.pos(raw);
            self.error(
                at,
                field,
                ValueError::new(format!("{} is not a fraction", raw.value))
                    .hint("expected a number greater than 0 and at most 1, e.g. 0.75"),
            );
            None
        }
    }
}

/// Parses a Debian relation as a [`ValueError`]-returning function (for [`Ctx::parse`]).
pub fn relation(s: &str) -> Result<crate::deb::Relation, ValueError> {
    crate::deb::parse_relation(s).map_err(|e| {
        ValueError::new(format!("`{s}` is not a package: {}", e.reason))
            .hint("write `name` or `name (op version)`, e.g. `openmpi-bin (>= 4.1)`; op is one of << <= = >= >>")
    })
}

pub fn pattern(s: &str) -> Result<crate::deb::PackagePattern, ValueError> {
    crate::deb::PackagePattern::parse(s).map_err(|e| {
        ValueError::new(format!("`{s}` is not a package pattern: {}", e.reason))
            .hint("write a name glob with an optional constraint, e.g. `telnetd` or `linux-image-* (<< 6.1)`")
    })
}

pub fn package_name(s: &str) -> Result<crate::deb::PackageName, ValueError> {
    crate::deb::PackageName::new(s).map_err(|e| {
        ValueError::new(format!("`{s}` is not a package name: {e}"))
            .hint("lowercase letters, digits and `+-.`, at least 2 characters")
    })
}

pub fn arch(s: &str) -> Result<crate::deb::Arch, ValueError> {
    crate::deb::Arch::new(s).map_err(|e| {
        ValueError::new(format!("`{s}` is not an architecture: {e}")).hint("e.g. `amd64`")
    })
}

/// A choice among fixed names, with a did-you-mean hint.
pub fn one_of<T>(
    s: &str,
    names: &[&str],
    f: impl FnOnce(&str) -> Option<T>,
) -> Result<T, ValueError> {
    f(s).ok_or_else(|| {
        let list = names.join(", ");
        let hint = match super::did_you_mean(s, names.iter().copied()) {
            Some(m) => format!("did you mean `{m}`? expected one of: {list}"),
            None => format!("expected one of: {list}"),
        };
        ValueError::new(format!("unknown value `{s}`")).hint(hint)
    })
}
