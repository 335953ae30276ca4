//! Diagnostics: one problem in an input file, with where it is, what was expected and a hint.
//! Every error a user can cause in a spec or policy ends up as a [`Diagnostic`].

use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// A position in an input file, 1-based line and column (in characters).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrcPos {
    pub file: Arc<str>,
    pub line: u64,
    pub column: u64,
}

impl SrcPos {
    pub fn new(file: &Arc<str>, line: u64, column: u64) -> Self {
        SrcPos {
            file: Arc::clone(file),
            line,
            column,
        }
    }

    /// The start of a file: for problems about the file as a whole.
    pub fn file_start(file: &Arc<str>) -> Self {
        SrcPos::new(file, 1, 1)
    }
}

impl fmt::Display for SrcPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

impl fmt::Debug for SrcPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for SrcPos {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A related location shown under the main message, e.g. the policy line a spec violates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Note {
    /// Short label printed before the position: `policy`, `first defined`, ...
    pub label: String,
    pub at: SrcPos,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub at: SrcPos,
    pub message: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn new(at: SrcPos, message: impl Into<String>) -> Self {
        Diagnostic {
            at,
            message: message.into(),
            notes: Vec::new(),
            hint: None,
        }
    }

    pub fn note(mut self, label: &str, at: &SrcPos, message: impl Into<String>) -> Self {
        self.notes.push(Note {
            label: label.to_string(),
            at: at.clone(),
            message: message.into(),
        });
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.message)?;
        for n in &self.notes {
            write!(f, "\n  {} {}: {}", n.label, n.at, n.message)?;
        }
        if let Some(h) = &self.hint {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

/// All problems found in one run, in file order; reported together, never only the first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn push(&mut self, d: Diagnostic) {
        self.0.push(d);
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn extend(&mut self, other: Diagnostics) {
        self.0.extend(other.0);
    }
    /// Sorted by file then position, so output is stable whatever order checks ran in.
    pub fn sorted(mut self) -> Self {
        self.0.sort_by(|a, b| a.at.cmp(&b.at));
        self.0.dedup();
        self
    }
    /// `Ok(v)` when nothing was reported, else the diagnostics as an error.
    pub fn into_result<T>(self, v: T) -> Result<T, Diagnostics> {
        if self.is_empty() {
            Ok(v)
        } else {
            Err(self.sorted())
        }
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

impl vse_exit::Classify for Diagnostics {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Self {
        Diagnostics(vec![d])
    }
}

/// The closest candidate to `word`, if it is plausibly a typo of it.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}
