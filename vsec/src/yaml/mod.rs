//! YAML loading for specs and policies: bounded size, depth and alias expansion, duplicate
//! keys rejected, every error located as `file:line:column`. Values that need a position
//! later (for merge conflicts) are read as [`At<T>`].

pub mod conv;
pub mod diag;

pub use conv::{Ctx, Loc};
pub use diag::{Diagnostic, Diagnostics, Note, SrcPos, did_you_mean};

use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A deserialized value with the position of its YAML node.
pub type At<T> = serde_saphyr::Spanned<T>;

/// Specs and policies are hand-written; anything bigger is a mistake or an attack.
pub const MAX_INPUT_BYTES: usize = 1 << 20;
/// Deepest nesting a spec needs is ~5; 64 leaves room and stops stack-exhaustion input.
pub const MAX_DEPTH: usize = 64;
/// Bounds the work alias expansion may cause (billion-laughs input).
pub const MAX_NODES: usize = 200_000;

#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// The file could not be read at all (missing, permissions): not a content problem.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The content is wrong; the diagnostics say where.
    #[error("{0}")]
    Invalid(Diagnostics),
}

/// A spec or policy the user named: unreadable or wrong, it is their input either way.
impl vse_exit::Classify for YamlError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

/// An input file: the name to show in messages and its bytes.
#[derive(Debug, Clone)]
pub struct Source {
    pub name: Arc<str>,
    /// Where relative paths inside the file are resolved from.
    pub dir: PathBuf,
    pub bytes: Vec<u8>,
}

impl Source {
    /// Reads at most [`MAX_INPUT_BYTES`] + 1 bytes, so a huge file costs no memory.
    pub fn read(path: &Path) -> Result<Source, YamlError> {
        let read_err = |source| YamlError::Read {
            path: path.to_path_buf(),
            source,
        };
        let bytes = vse_base::read_input(path, MAX_INPUT_BYTES as u64).map_err(read_err)?;
        Ok(Source::from_bytes(&path.display().to_string(), path, bytes))
    }

    pub fn from_bytes(name: &str, path: &Path, bytes: Vec<u8>) -> Source {
        Source {
            name: Arc::from(name),
            dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
            bytes,
        }
    }

    pub fn pos<T>(&self, at: &At<T>) -> SrcPos {
        pos_of(&self.name, at)
    }
}

/// The position of a spanned value; values synthesized without a node map to 1:1.
pub fn pos_of<T>(file: &Arc<str>, at: &At<T>) -> SrcPos {
    SrcPos::new(
        file,
        at.referenced.line().max(1),
        at.referenced.column().max(1),
    )
}

/// Parses one YAML document into `T`, enforcing the size, depth and alias limits.
pub fn parse<T: DeserializeOwned>(src: &Source, what: &str) -> Result<T, Diagnostic> {
    let start = SrcPos::file_start(&src.name);
    if src.bytes.len() > MAX_INPUT_BYTES {
        return Err(Diagnostic::new(
            start,
            format!("file is larger than {} KiB", MAX_INPUT_BYTES / 1024),
        )
        .hint(format!(
            "a {what} is a short hand-written file; check that this is the right file"
        )));
    }
    let text = match std::str::from_utf8(&src.bytes) {
        Ok(t) => t,
        Err(e) => {
            let (line, column) = line_col(&src.bytes[..e.valid_up_to()]);
            return Err(Diagnostic::new(
                SrcPos::new(&src.name, line, column),
                "invalid UTF-8 byte",
            )
            .hint("save the file as UTF-8"));
        }
    };
    if text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---"
    }) {
        return Err(
            Diagnostic::new(start, format!("empty {what}: expected a YAML mapping"))
                .hint("start with `version: 1`; see the examples in specs/"),
        );
    }
    let options = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        with_snippet: false,
        strict_booleans: true,
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            max_nodes: MAX_NODES,
            max_total_scalar_bytes: MAX_INPUT_BYTES * 4,
            max_documents: 1,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_NODES,
            max_replay_stack_depth: 16,
        },
    };
    serde_saphyr::from_str_with_options(text, options).map_err(|e| to_diagnostic(&src.name, &e))
}

/// 1-based line and column (in characters) of the end of `prefix`.
fn line_col(prefix: &[u8]) -> (u64, u64) {
    let text = String::from_utf8_lossy(prefix);
    let line = text.matches('\n').count() as u64 + 1;
    let last = text.rsplit('\n').next().unwrap_or("");
    (line, last.chars().count() as u64 + 1)
}

fn to_diagnostic(file: &Arc<str>, e: &serde_saphyr::Error) -> Diagnostic {
    let e = e.without_snippet();
    let (line, column) = e
        .location()
        .map(|l| (l.line().max(1), l.column().max(1)))
        .unwrap_or((1, 1));
    let at = SrcPos::new(file, line, column);
    match e {
        serde_saphyr::Error::SerdeUnknownField {
            field, expected, ..
        } => unknown_word(at, "key", field, expected),
        serde_saphyr::Error::SerdeUnknownVariant {
            variant, expected, ..
        } => unknown_word(at, "value", variant, expected),
        serde_saphyr::Error::SerdeMissingField { field, .. } => {
            Diagnostic::new(at, format!("missing required key `{field}`"))
        }
        other => {
            let text = other.to_string();
            let suffix = format!(" at line {line}, column {column}");
            let mut msg = text.strip_suffix(&suffix).unwrap_or(&text).to_string();
            // The crate's text speaks to developers ("set DuplicateKeyPolicy..."); users get
            // the key.
            if let Some(rest) = msg.strip_prefix("duplicate mapping key: ") {
                let key = rest.split(", set ").next().unwrap_or(rest).to_string();
                msg = format!("duplicate key `{key}`");
            }
            let hint = hint_for(&msg);
            let d = Diagnostic::new(at, msg);
            match hint {
                Some(h) => d.hint(h),
                None => d,
            }
        }
    }
}

fn unknown_word(at: SrcPos, kind: &str, word: &str, expected: &[&str]) -> Diagnostic {
    let d = Diagnostic::new(at, format!("unknown {kind} `{word}`"));
    let list = expected.join(", ");
    match did_you_mean(word, expected.iter().copied()) {
        Some(m) => d.hint(format!("did you mean `{m}`? expected one of: {list}")),
        None => d.hint(format!("expected one of: {list}")),
    }
}

fn hint_for(msg: &str) -> Option<&'static str> {
    if msg.starts_with("duplicate key") {
        Some("each key may appear once per mapping; remove or merge the repeated one")
    } else if msg.contains("budget")
        || msg.contains("alias")
        || msg.contains("depth")
        || msg.contains("recursion")
        || msg.contains("limit")
    {
        Some("the file nests too deeply or expands too many aliases; write it out plainly")
    } else if msg.starts_with("expected string") {
        Some("expected text here; quote it if it looks like a number or contains `: `")
    } else if msg.starts_with("invalid u") || msg.starts_with("invalid i") {
        Some("expected a whole number here")
    } else if msg.starts_with("invalid f") {
        Some("expected a number here, e.g. 0.75")
    } else if msg.contains("bool") {
        Some("expected `true` or `false`")
    } else {
        None
    }
}
