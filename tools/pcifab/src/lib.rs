// SPDX-License-Identifier: GPL-2.0-only

//! The command line of `pcifab` as data: the clap definition the tool parses with and that
//! `pcifab-gen` turns into shell completions and man pages.

pub mod cli;
