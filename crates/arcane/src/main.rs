//! `arcane`: the command-line interface to Arcane.
//!
//! `main` is thin on purpose: it parses the command line, resolves configuration once
//! (`config`), calls one command module, and maps the outcome to an exit code in one
//! place (`error::exit_code`). All output goes through `output::Output`.

mod cli;
mod cmd;
mod config;
mod error;
mod output;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return cli::refused(error),
    };
    // A worker the Core host starts speaks only to its host: no workspace, no signal
    // handlers.
    if let Some(code) = cli.command.run_worker() {
        return ExitCode::from(code);
    }
    let output = output::Output::new(cli.global.output, cli.global.verbose);
    let context = match config::Context::resolve(&cli.global, output) {
        Ok(context) => context,
        Err(error) => {
            let output = output::Output::new(cli.global.output, cli.global.verbose);
            output.error(&*error.0);
            return ExitCode::from(error::exit_code(error.0.code()));
        }
    };
    match cmd::run(&context, cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            context.output.error(&*error.0);
            ExitCode::from(error::exit_code(error.0.code()))
        }
    }
}
