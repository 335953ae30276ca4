//! A spec's `shares:` items, checked as far as the spec alone allows: the host side is only
//! known on the host at launch (`~`, the launch directory), the guest side is known here.

use super::raw::RawShare;
use crate::env::ShareSpec;
use crate::shares::{guest_path, host_path, mode, written};
use crate::units::AbsPath;
use crate::yaml::{At, Ctx, Loc};

pub(super) fn convert(cx: &mut Ctx, raw: &[At<RawShare>]) -> Vec<Loc<ShareSpec>> {
    let mut out: Vec<Loc<ShareSpec>> = Vec::new();
    for item in raw {
        let at = cx.pos(item);
        let share = match &item.value {
            RawShare::Text(s) => match written(s) {
                Ok(w) => Some(ShareSpec {
                    host: w.host,
                    guest: w.guest,
                    ro: w.ro,
                }),
                Err(e) => {
                    cx.error(at.clone(), "shares", e);
                    None
                }
            },
            RawShare::Map(map) => {
                let (host, guest, m) = (&map.host, &map.guest, &map.mode);
                let host = cx.parse(host, "shares.host", host_path);
                let guest = guest
                    .as_ref()
                    .map(|g| cx.parse(g, "shares.guest", guest_path));
                let ro = m.as_ref().map(|m| cx.parse(m, "shares.mode", mode));
                if matches!(guest, Some(None)) || matches!(ro, Some(None)) {
                    None
                } else {
                    host.map(|h| ShareSpec {
                        host: h.value,
                        guest: guest.flatten().map(|g| g.value),
                        ro: ro.flatten().is_some_and(|r| r.value),
                    })
                }
            }
        };
        let Some(share) = share else { continue };
        // Where the guest path is already known (given, or an absolute host path), it must
        // be a valid one and not taken by an earlier item.
        let guest = match (&share.guest, share.host.starts_with('/')) {
            (Some(g), _) => Some(g.clone()),
            (None, true) => {
                let p = crate::shares::lexical_str(&share.host);
                match guest_path(&p) {
                    Ok(g) => Some(g),
                    Err(e) => {
                        let e = e.hint(format!(
                            "give it a guest path of its own: `{}:/data`",
                            share.host
                        ));
                        cx.error(at.clone(), "shares", e);
                        continue;
                    }
                }
            }
            (None, false) => None,
        };
        if let Some(g) = &guest
            && let Some(first) = out.iter().find(|o| guest_of(o) == Some(g.clone()))
        {
            let d = crate::yaml::Diagnostic::new(
                at.clone(),
                format!("shares: guest path {g} is already shared"),
            )
            .note("first", &first.at, "shared here")
            .hint("give one of them another guest path (HOST:GUEST)");
            cx.diags.push(d);
            continue;
        }
        out.push(Loc { value: share, at });
    }
    out
}

fn guest_of(s: &Loc<ShareSpec>) -> Option<AbsPath> {
    match (&s.value.guest, s.value.host.starts_with('/')) {
        (Some(g), _) => Some(g.clone()),
        (None, true) => guest_path(&crate::shares::lexical_str(&s.value.host)).ok(),
        (None, false) => None,
    }
}
