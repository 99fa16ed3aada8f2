//! The `lockstep` command line: parse, call the library, print. No codec logic lives here.

mod cli;

use clap::Parser;

fn main() {
    // Mesa's Vulkan drivers complain on stderr when this is unset (containers, CI); a device
    // probe should not print noise, so give them the temp directory before any thread starts.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    lockstep::memory::reuse_freed_memory();
    let args = cli::Cli::parse();
    if let Err(e) = cli::run(args) {
        eprintln!("error: {e}");
        // The README's "Exit status" table: 3 damaged input, 4 incomplete archive, 5 limit.
        std::process::exit(e.exit_code());
    }
}
