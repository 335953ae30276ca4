//! Every `vse …` command a message, a help text or the README prints in backticks is one the
//! parser accepts as printed.
//!
//! Where the commands are found: backticked spans that start with `vse ` inside the string
//! literals of every workspace crate's `src/` (comments are not printed and are skipped), in
//! the rendered `--help` of every (sub)command, and in the README's prose (its command table
//! is checked against `--help` by tests/cli_check.rs).
//!
//! The convention a printed command follows:
//! - Upper-case words are placeholders for a value: [`PLACEHOLDERS`] gives each a plausible
//!   one (a path for `IMAGE`, a number for `N`, …); one it lacks fails the test, so a new
//!   placeholder is added there. Format arguments (`{db}`) are placeholders too.
//! - `…` stands for the arguments a command needs that the hint leaves out; [`ELIDED`] says
//!   what they are for each subcommand (`vse launch … --restore DIR` is checked as
//!   `vse launch IMAGE --restore DIR`).
//! - `vse` followed by subcommand names only (`vse build`, `vse vm status`) names a command
//!   rather than running it: the names must exist, the required arguments may be left out.
//! - Anything else must parse as printed: a flag that takes a value is printed with one
//!   (`vse attach --job ID`, never `vse attach --job`).
//!
//! A parse that ends in `--help` or `--version` output passes; any other parse error fails.

use super::Cli;
use clap::{CommandFactory, Parser, error::ErrorKind};
use std::path::{Path, PathBuf};

/// The value each placeholder word is checked with.
const PLACEHOLDERS: &[(&str, &str)] = &[
    ("IMAGE", "/srv/images/lammps"),
    ("DIR", "/scratch/dir"),
    ("OUT", "out"),
    ("SPEC", "job.vse.yaml"),
    ("POLICY", "site.policy.yaml"),
    ("LOCK", "job.lock"),
    ("SOURCE", "oci-archive:app.tar"),
    ("FILE", "/var/log/vse.log"),
    ("KEY", "/etc/vse-build/signing.key.asc"),
    ("DB", "/var/lib/vse/state.db"),
    ("ID", "4711"),
    ("JOB", "4711"),
    ("NODE", "node2"),
    ("USER", "vse-tester"),
    ("N", "2"),
    ("MiB", "4096"),
    ("CMD", "hostname"),
    ("ARGS", "-v"),
    ("PHASE", "init"),
];

/// What `…` stands for, by subcommand: the arguments the hint leaves out, around the words
/// that follow it (`{}`). The command passes when one of the forms parses: `-- CMD` is needed
/// unless the hint gives the command or `--restore`.
const ELIDED: &[(&str, &[&str])] = &[
    ("launch", &["IMAGE {}", "IMAGE {} -- CMD"]),
    ("run", &["IMAGE {}", "IMAGE {} -- CMD"]),
];

/// One command found: where, and its text between the backticks.
#[derive(Debug)]
struct Found {
    at: String,
    text: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `[workspace] members` of the root Cargo.toml.
fn members() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let list = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .expect("Cargo.toml: [workspace] members = [...]")
        .0;
    (list.split(','))
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.map(Result::unwrap) {
        let path = e.path();
        if e.file_type().unwrap().is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The string literals of Rust source, unescaped (a `\` line continuation joins the lines as
/// the compiler does), each with its line number. Comments, char literals and lifetimes are
/// skipped.
fn string_literals(src: &str) -> Vec<(usize, String)> {
    let s: Vec<char> = src.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let count = |from: usize, to: usize| s[from..to].iter().filter(|c| **c == '\n').count();
    while i < s.len() {
        let start = i;
        match s[i] {
            '/' if s.get(i + 1) == Some(&'/') => {
                while i < s.len() && s[i] != '\n' {
                    i += 1;
                }
            }
            '/' if s.get(i + 1) == Some(&'*') => {
                let mut depth = 0;
                while i < s.len() {
                    if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            '\'' => {
                // A char literal ('x', '\n', '\'', '"'); otherwise a lifetime or label.
                if s.get(i + 1) == Some(&'\\') {
                    i += 3;
                    while i < s.len() && s[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if s.get(i + 2) == Some(&'\'') {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            '"' => {
                i += 1;
                let mut text = String::new();
                while i < s.len() && s[i] != '"' {
                    if s[i] == '\\' {
                        i += 1;
                        match s[i] {
                            '\n' => {
                                while s.get(i + 1).is_some_and(|c| c.is_whitespace()) {
                                    i += 1;
                                }
                            }
                            'n' => text.push('\n'),
                            't' => text.push('\t'),
                            c @ ('"' | '\\' | '\'') => text.push(c),
                            // \u{…}, \x.., \0, \r: nothing the commands use.
                            _ => text.push(' '),
                        }
                    } else {
                        text.push(s[i]);
                    }
                    i += 1;
                }
                i += 1;
                out.push((line, text));
            }
            c if ident(c) => {
                while i < s.len() && ident(s[i]) {
                    i += 1;
                }
                // r"…", r#"…"#, br"…", cr#"…"#: the body as written, no escapes.
                let prefix: String = s[start..i].iter().collect();
                let mut j = i;
                while s.get(j) == Some(&'#') {
                    j += 1;
                }
                if matches!(prefix.as_str(), "r" | "br" | "cr") && s.get(j) == Some(&'"') {
                    let close: String = std::iter::once('"')
                        .chain(std::iter::repeat_n('#', j - i))
                        .collect();
                    let body: String = s[j + 1..].iter().collect();
                    let end = body.find(&close).expect("unterminated raw string");
                    out.push((line, body[..end].to_owned()));
                    i = j + 1 + body[..end].chars().count() + close.chars().count();
                }
            }
            _ => i += 1,
        }
        line += count(start, i.min(s.len()));
    }
    out
}

/// The backticked `vse …` spans of a text.
fn commands(text: &str) -> impl Iterator<Item = &str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.starts_with("vse "))
}

/// Every command the workspace's sources, help texts and README print.
fn found() -> Vec<Found> {
    let mut all = Vec::new();
    for m in members() {
        let mut files = Vec::new();
        rust_files(&root().join(&m).join("src"), &mut files);
        files.sort();
        // This file's literals are the tests' examples, broken ones included.
        for f in files.into_iter().filter(|f| !f.ends_with(file!())) {
            let src = std::fs::read_to_string(&f).unwrap();
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            for (line, lit) in string_literals(&src) {
                all.extend(commands(&lit).map(|c| Found {
                    at: format!("{rel}:{line}"),
                    text: c.to_owned(),
                }));
            }
        }
    }
    let mut stack = vec![(String::from("vse"), Cli::command())];
    while let Some((path, mut cmd)) = stack.pop() {
        let help = cmd.render_long_help().to_string();
        all.extend(commands(&help).map(|c| Found {
            at: format!("`{path} --help`"),
            text: c.to_owned(),
        }));
        for sub in cmd.get_subcommands() {
            stack.push((format!("{path} {}", sub.get_name()), sub.clone()));
        }
    }
    // The README's prose, a span may wrap; the command table rows are tests/cli_check.rs's,
    // and code blocks are shell (lines kept empty, so the line numbers stay).
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut fenced = false;
    let prose: Vec<&str> = (readme.lines())
        .map(|l| {
            let fence = l.starts_with("```");
            fenced ^= fence;
            if fenced || fence || l.starts_with("| `vse ") {
                ""
            } else {
                l
            }
        })
        .collect();
    let prose = prose.join("\n");
    let mut at = 0;
    for (i, part) in prose.split('`').enumerate() {
        if i % 2 == 1 && part.starts_with("vse ") {
            let line = prose[..at].matches('\n').count() + 1;
            all.push(Found {
                at: format!("README.md:{line}"),
                text: part.to_owned(),
            });
        }
        at += part.len() + 1;
    }
    all
}

/// The argument lists a printed command is checked with, one per form of [`ELIDED`]:
/// placeholders and `…` filled in (a trailing `…`, as in `vse bench …`, is dropped: the
/// words before it name a command).
fn args(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mut words: Vec<&str> = text.split_whitespace().collect();
    if words.last() == Some(&"…") {
        words.pop();
    }
    let forms: Vec<String> = match words.iter().position(|w| *w == "…") {
        None => vec![words.join(" ")],
        Some(at) => {
            let (before, after) = (words[..at].join(" "), words[at + 1..].join(" "));
            let sub = (at == 2).then(|| words[1]);
            let (_, forms) = (ELIDED.iter())
                .find(|(s, _)| Some(*s) == sub)
                .ok_or("`…` stands for nothing here; say what in ELIDED")?;
            (forms.iter())
                .map(|f| format!("{before} {}", f.replace("{}", &after)))
                .collect()
        }
    };
    (forms.iter())
        .map(|f| f.split_whitespace().map(fill).collect())
        .collect()
}

/// One word with its placeholders replaced: whole upper-case words (`IMAGE`, `local:N`,
/// `--vse=IMAGE`) and format arguments (`{db}`). An upper-case word [`PLACEHOLDERS`] lacks
/// is an error, so that every placeholder a hint uses is one the table knows.
fn fill(word: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = word;
    while let Some(c) = rest.chars().next() {
        let len = if c == '{' {
            rest.find('}').map_or(rest.len(), |i| i + 1)
        } else if c.is_alphanumeric() {
            (rest.find(|c: char| !c.is_alphanumeric())).unwrap_or(rest.len())
        } else {
            c.len_utf8()
        };
        let (part, tail) = rest.split_at(len);
        match PLACEHOLDERS.iter().find(|(p, _)| *p == part) {
            Some((_, value)) => out.push_str(value),
            None if part.starts_with('{') => out.push('x'),
            None if part.chars().all(|c| c.is_ascii_uppercase()) => {
                return Err(format!("placeholder {part} is not in PLACEHOLDERS"));
            }
            None => out.push_str(part),
        }
        rest = tail;
    }
    Ok(out)
}

/// Whether `vse` is followed by subcommand names only.
fn names_a_command(args: &[String]) -> bool {
    let mut cmd = Cli::command();
    for a in &args[1..] {
        match cmd.find_subcommand(a) {
            Some(sub) => cmd = sub.clone(),
            None => return false,
        }
    }
    true
}

/// Why the parser refuses a printed command, or `None` when it accepts it.
fn refused(text: &str) -> Option<String> {
    let forms = match args(text) {
        Ok(forms) => forms,
        Err(why) => return Some(why),
    };
    let mut why = Vec::new();
    for args in forms {
        match Cli::try_parse_from(&args) {
            Ok(_) => return None,
            Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
                return None;
            }
            Err(_) if names_a_command(&args) => return None,
            Err(e) => why.push(format!(
                "{args:?}: {}",
                e.to_string().lines().next().unwrap_or_default()
            )),
        }
    }
    Some(why.join("; "))
}

/// Every printed `vse …` command parses (see the module's doc comment for the convention).
#[test]
fn every_printed_vse_command_parses() {
    let found = found();
    let broken: Vec<String> = (found.iter())
        .filter_map(|f| refused(&f.text).map(|why| format!("{}: `{}`: {why}", f.at, f.text)))
        .collect();
    println!("{} printed `vse …` commands checked", found.len());
    assert!(
        found.len() >= 100,
        "only {} commands found: is the scan broken?",
        found.len()
    );
    assert!(
        broken.is_empty(),
        "{} printed commands do not parse:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn hint_scan_reads_string_literals_not_comments() {
    let src = "// `vse no`\nlet a = '\"'; let b = \"`vse build \\\n   SPEC`\"; /* `vse no` */ let c = r#\"`vse x`\"#;\nlet d = '\\''; let e = br\"`vse y \\n`\";";
    let lits = string_literals(src);
    let spans: Vec<(usize, &str)> = (lits.iter())
        .flat_map(|(l, t)| commands(t).map(move |c| (*l, c)))
        .collect();
    assert_eq!(
        spans,
        [(2, "vse build SPEC"), (3, "vse x"), (4, "vse y \\n")]
    );
    assert_eq!(
        args("vse launch … --allocation local:N --node-memory MiB").unwrap()[0],
        [
            "vse",
            "launch",
            "/srv/images/lammps",
            "--allocation",
            "local:2",
            "--node-memory",
            "4096"
        ]
    );
    assert!(refused("vse attach --job").is_some());
    assert!(refused("vse vm status").is_none());
    assert!(refused("vse bench …").is_none());
    assert!(refused("vse launch --restore DIR").is_some());
    assert!(refused("vse launch … --restore DIR").is_none());
    assert!(refused("vse launch … --job ID").is_none());
    assert!(refused("vse launch IMAGE --job ID").is_some());
}
