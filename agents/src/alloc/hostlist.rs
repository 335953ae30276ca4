//! Slurm hostlist expressions (`n[01-03,7],gpu[1-2]-ib,r[1-2]n[1-2]`), parsed with nom.
//!
//! Semantics follow `scontrol show hostnames`: top-level commas separate names, each bracket
//! group is a comma list of numbers or `lo-hi` ranges, a range keeps the zero padding of its
//! lower bound, and several groups in one name expand as a cartesian product with the leftmost
//! group varying slowest.

use nom::{
    IResult, Parser,
    branch::alt,
    bytes::complete::{tag, take_while1},
    character::complete::digit1,
    combinator::{all_consuming, map, opt},
    multi::{many1, separated_list1},
    sequence::{delimited, preceded},
};
use thiserror::Error;

/// Expansion is refused beyond this many hosts: a typo like `n[1-99999999]` must not eat memory.
pub const MAX_HOSTS: usize = 1 << 20;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum HostlistError {
    #[error(
        "invalid hostlist `{input}` at column {column}: expected a host name, `[lo-hi,...]` ranges or `,`; hint: e.g. `node[01-04,7]`"
    )]
    Syntax { input: String, column: usize },
    #[error(
        "invalid hostlist `{input}`: range {lo}-{hi} runs backwards; hint: write the lower bound first"
    )]
    Backwards { input: String, lo: u64, hi: u64 },
    #[error("hostlist `{input}` expands to more than {MAX_HOSTS} hosts")]
    TooLarge { input: String },
    #[error("empty hostlist: expected at least one host name")]
    Empty,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Lit(String),
    Group(Vec<(String, String)>), // (lo, hi) as written, to keep widths
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

fn range(i: &str) -> IResult<&str, (String, String)> {
    map(
        (digit1, opt(preceded(tag("-"), digit1))),
        |(lo, hi): (&str, Option<&str>)| (lo.to_string(), hi.unwrap_or(lo).to_string()),
    )
    .parse(i)
}

fn group(i: &str) -> IResult<&str, Piece> {
    map(
        delimited(tag("["), separated_list1(tag(","), range), tag("]")),
        Piece::Group,
    )
    .parse(i)
}

fn literal(i: &str) -> IResult<&str, Piece> {
    map(take_while1(is_name_char), |s: &str| {
        Piece::Lit(s.to_string())
    })
    .parse(i)
}

fn name(i: &str) -> IResult<&str, Vec<Piece>> {
    many1(alt((literal, group))).parse(i)
}

// Slurm skips empty items (`a,,b` is `a b`), so they are optional here too.
fn hostlist(i: &str) -> IResult<&str, Vec<Option<Vec<Piece>>>> {
    all_consuming(separated_list1(tag(","), opt(name))).parse(i)
}

/// Expands a hostlist expression into host names, in Slurm's order (duplicates kept, as Slurm does).
///
/// ```
/// use agents::alloc::{HostlistError, expand_hostlist};
/// // A range keeps the zero padding of its lower bound; a single number is kept as written.
/// assert_eq!(
///     expand_hostlist("n[01-03,7],gpu1").unwrap(),
///     ["n01", "n02", "n03", "n7", "gpu1"]
/// );
/// // Several groups: the cartesian product, leftmost group slowest.
/// assert_eq!(
///     expand_hostlist("r[1-2]n[1-2]").unwrap(),
///     ["r1n1", "r1n2", "r2n1", "r2n2"]
/// );
/// assert!(matches!(
///     expand_hostlist("n[5-3]"),
///     Err(HostlistError::Backwards { lo: 5, hi: 3, .. })
/// ));
/// ```
pub fn expand(input: &str) -> Result<Vec<String>, HostlistError> {
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Err(HostlistError::Empty);
    }
    let names = match hostlist(trimmed) {
        Ok((_, names)) => names,
        Err(nom::Err::Error(e) | nom::Err::Failure(e)) => {
            let offset = trimmed.len() - e.input.len();
            return Err(HostlistError::Syntax {
                input: input.to_string(),
                column: offset + 1,
            });
        }
        Err(nom::Err::Incomplete(_)) => {
            return Err(HostlistError::Syntax {
                input: input.to_string(),
                column: trimmed.len() + 1,
            });
        }
    };
    let mut out = Vec::new();
    if names.iter().all(Option::is_none) {
        return Err(HostlistError::Empty);
    }
    for pieces in names.into_iter().flatten() {
        let mut acc = vec![String::new()];
        for piece in pieces {
            let parts = match piece {
                Piece::Lit(s) => vec![s],
                Piece::Group(ranges) => expand_group(input, &ranges)?,
            };
            if acc.len().saturating_mul(parts.len()) + out.len() > MAX_HOSTS {
                return Err(HostlistError::TooLarge {
                    input: input.to_string(),
                });
            }
            acc = acc
                .iter()
                .flat_map(|a| parts.iter().map(move |p| format!("{a}{p}")))
                .collect();
        }
        out.extend(acc);
    }
    Ok(out)
}

fn expand_group(input: &str, ranges: &[(String, String)]) -> Result<Vec<String>, HostlistError> {
    let mut parts = Vec::new();
    for (lo_s, hi_s) in ranges {
        let too_large = || HostlistError::TooLarge {
            input: input.to_string(),
        };
        let lo: u64 = lo_s.parse().map_err(|_| too_large())?;
        let hi: u64 = hi_s.parse().map_err(|_| too_large())?;
        if hi < lo {
            return Err(HostlistError::Backwards {
                input: input.to_string(),
                lo,
                hi,
            });
        }
        if (hi - lo) as usize + parts.len() >= MAX_HOSTS {
            return Err(too_large());
        }
        // Slurm pads to the width of the lower bound as written (so `[01-10]` gives 01..10).
        let width = lo_s.len();
        parts.extend((lo..=hi).map(|n| format!("{n:0width$}")));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(s: &str) -> Vec<String> {
        expand(s).unwrap()
    }

    #[test]
    fn plain_and_lists() {
        assert_eq!(ex("n1"), ["n1"]);
        assert_eq!(ex("a,b,c"), ["a", "b", "c"]);
        assert_eq!(ex("n[1-3]"), ["n1", "n2", "n3"]);
        assert_eq!(ex("n[1-2,5]"), ["n1", "n2", "n5"]);
    }

    #[test]
    fn leading_zeros() {
        assert_eq!(ex("n[08-11]"), ["n08", "n09", "n10", "n11"]);
        assert_eq!(ex("n[001-002]"), ["n001", "n002"]);
    }

    #[test]
    fn several_groups_and_suffix() {
        assert_eq!(ex("r[1-2]n[1-2]"), ["r1n1", "r1n2", "r2n1", "r2n2"]);
        assert_eq!(ex("gpu[1-2]-ib,cpu7"), ["gpu1-ib", "gpu2-ib", "cpu7"]);
    }

    #[test]
    fn errors_are_located() {
        assert!(matches!(
            expand("n[1-"),
            Err(HostlistError::Syntax { column: 2, .. })
        ));
        assert!(matches!(
            expand("n[3-1]"),
            Err(HostlistError::Backwards { lo: 3, hi: 1, .. })
        ));
        assert!(matches!(expand(""), Err(HostlistError::Empty)));
        assert!(matches!(
            expand("n[1-99999999]"),
            Err(HostlistError::TooLarge { .. })
        ));
        assert!(matches!(expand("a,[1"), Err(HostlistError::Syntax { .. })));
        assert_eq!(ex("a,,b"), ["a", "b"]);
    }
}
