//! The deb822 format (Debian Policy §5.1): stanzas of `Field: value` lines separated by blank
//! lines, continuation lines start with a space or tab. Used by `Packages`, `Release` and
//! `.sources` files alike.
//!
//! The parser borrows from the input and records each field's line number so that errors in
//! huge indices still point at `file:line`.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct Deb822Error {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// One stanza. Field names are compared case-insensitively, as dpkg does.
#[derive(Debug, Clone, Default)]
pub struct Stanza<'a> {
    /// 1-based line of the stanza's first field.
    pub line: usize,
    fields: Vec<(&'a str, &'a str, usize)>,
}

impl<'a> Stanza<'a> {
    /// The raw value (continuation lines keep their newlines and leading space).
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.fields
            .iter()
            .find(|(n, _, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v, _)| *v)
    }

    /// The line on which `name` starts, for error messages.
    pub fn line_of(&self, name: &str) -> usize {
        self.fields
            .iter()
            .find(|(n, _, _)| n.eq_ignore_ascii_case(name))
            .map_or(self.line, |(_, _, l)| *l)
    }

    pub fn fields(&self) -> impl Iterator<Item = (&'a str, &'a str)> + '_ {
        self.fields.iter().map(|(n, v, _)| (*n, *v))
    }
}

/// Parses a whole deb822 document. `file` only labels errors.
pub fn parse_stanzas<'a>(file: &Path, text: &'a str) -> Result<Vec<Stanza<'a>>, Deb822Error> {
    let err = |line: usize, column: usize, message: &str| Deb822Error {
        file: file.to_path_buf(),
        line,
        column,
        message: message.to_string(),
    };
    let mut out = Vec::new();
    let mut cur = Stanza::default();
    // Byte offsets of the current field's value, extended by continuation lines.
    let mut open: Option<(&'a str, usize, usize, usize)> = None;
    let mut offset = 0usize;
    let close = |cur: &mut Stanza<'a>, open: &mut Option<(&'a str, usize, usize, usize)>| {
        if let Some((name, start, end, line)) = open.take() {
            cur.fields.push((name, text[start..end].trim(), line));
        }
    };
    for (idx, raw) in text.split_inclusive('\n').enumerate() {
        let lineno = idx + 1;
        let line_start = offset;
        offset += raw.len();
        let line = raw.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            close(&mut cur, &mut open);
            if !cur.fields.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            continue;
        }
        if line.starts_with('#') {
            // Comments are allowed in .sources files and harmless elsewhere.
            continue;
        }
        if line.starts_with([' ', '\t']) {
            match &mut open {
                Some((_, _, end, _)) => *end = line_start + line.len(),
                None => {
                    return Err(err(
                        lineno,
                        1,
                        "continuation line outside of a field (a line starting with a space must follow a `Field: value` line)",
                    ));
                }
            }
            continue;
        }
        close(&mut cur, &mut open);
        let Some(colon) = line.find(':') else {
            return Err(err(
                lineno,
                1,
                "expected `Field: value` (no `:` on this line); is the file truncated or not a deb822 file?",
            ));
        };
        let name = &line[..colon];
        if name.is_empty()
            || name
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(err(lineno, 1, "invalid field name before `:`"));
        }
        if cur.fields.is_empty() && open.is_none() {
            cur.line = lineno;
        }
        open = Some((
            name,
            line_start + colon + 1,
            line_start + line.len(),
            lineno,
        ));
    }
    close(&mut cur, &mut open);
    if !cur.fields.is_empty() {
        out.push(cur);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_continuations_and_blank_separators() {
        let t = "Package: a\nVersion: 1\nDescription: short\n long\n .\n more\n\n\nPackage: b\r\nversion: 2\n";
        let s = parse_stanzas(Path::new("P"), t).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].get("package"), Some("a"));
        assert_eq!(s[0].get("Description"), Some("short\n long\n .\n more"));
        assert_eq!(s[1].get("Version"), Some("2"));
        assert_eq!(s[1].line, 9);
        assert_eq!(s[1].line_of("Version"), 10);
    }

    #[test]
    fn errors_point_at_the_line() {
        let e = parse_stanzas(Path::new("P"), "Package: a\nVersion 1\n").unwrap_err();
        assert_eq!((e.line, e.column), (2, 1));
        assert!(e.to_string().starts_with("P:2:1:"), "{e}");
        let e = parse_stanzas(Path::new("P"), " x\n").unwrap_err();
        assert!(e.message.contains("continuation"));
    }
}
