//! `vse`: the one user-facing binary. Each subcommand lives in `src/cmd/<name>.rs` and is a
//! thin layer over the library crates; errors become exit codes here and nowhere else.

#![forbid(unsafe_code)]

mod cmd;
mod environment;
mod exit;
mod guest_agent;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cmd::Cli::parse();
    match cmd::run(cli) {
        Ok(code) => code,
        Err(err) => exit::report(&err),
    }
}
