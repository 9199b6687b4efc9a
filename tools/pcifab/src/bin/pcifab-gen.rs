// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab-gen DIR`: writes pcifab's shell completions (DIR/completions/pcifab.bash,
//! DIR/completions/_pcifab, DIR/completions/pcifab.fish) and man pages (DIR/man/pcifab.1,
//! DIR/man/pcifab-<command>.1, ...) from the same clap definition the tool parses with.
//! `make install` and the packages install them.

use std::{path::PathBuf, process::ExitCode};

use clap::CommandFactory;
use clap_complete::{generate_to, Shell};
use pcifab::cli::Cli;

fn run(dir: PathBuf) -> Result<(), String> {
    let completions = dir.join("completions");
    let man = dir.join("man");
    for d in [&completions, &man] {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let mut cmd = Cli::command();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        generate_to(shell, &mut cmd, "pcifab", &completions)
            .map_err(|e| format!("{shell} completion into {}: {e}", completions.display()))?;
    }
    clap_mangen::generate_to(Cli::command(), &man)
        .map_err(|e| format!("man pages into {}: {e}", man.display()))?;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [v] if v == "--version" || v == "-V" => {
            println!("pcifab-gen {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        [d] if !d.starts_with('-') => match run(PathBuf::from(d)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("pcifab-gen: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: pcifab-gen DIR  (writes DIR/completions/* and DIR/man/*.1)");
            ExitCode::from(2)
        }
    }
}
