//! A till of the demo's shop as a process of its own (see `demo::till`):
//! what a host's replica binary looks like.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let operator = magic_sync::run::process::Operator::new(std::io::stderr());
    demo::till::run(demo::till::Args::parse(), &operator)
}
