//! A policy's `shares:` section: prefixes as absolute paths, defaults as `cwd`, `home` or
//! paths, each kept at its line so a refused share can name the rule.

use super::model::PolicyShares;
use super::raw::RawShares;
use crate::env::AllowedShare;
use crate::units::AbsPath;
use crate::yaml::{Ctx, Loc};

pub(super) fn convert(cx: &mut Ctx, s: &RawShares) -> PolicyShares {
    let allowed = s.allowed.as_ref().map(|a| Loc {
        at: cx.pos(a),
        value: (a.value.iter())
            .filter_map(|e| {
                let path = cx.parse(&e.value.path, "shares.allowed.path", AbsPath::parse);
                let ro = match &e.value.mode {
                    Some(m) => Some(
                        cx.parse(m, "shares.allowed.mode", crate::shares::mode)?
                            .value,
                    ),
                    None => Some(false),
                };
                Some(Loc {
                    value: AllowedShare {
                        path: path?.value,
                        ro: ro?,
                    },
                    at: cx.pos(e),
                })
            })
            .collect(),
    });
    let default = s.default.as_ref().map(|d| Loc {
        at: cx.pos(d),
        value: (d.value.iter())
            .filter_map(|e| cx.parse(e, "shares.default", crate::shares::default_entry))
            .collect(),
    });
    let forbidden = (s.forbidden.iter())
        .filter_map(|f| cx.parse(f, "shares.forbidden", AbsPath::parse))
        .collect();
    PolicyShares {
        allowed,
        default,
        forbidden,
    }
}
