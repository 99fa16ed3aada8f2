//! What the command line says besides its results: `-q` / `-v`, notes, progress bars.
//!
//! Results (tables, `--json` documents, decoded data) go to stdout; everything else (summary
//! lines, notes, progress) goes to stderr, where `-q` silences it. Errors are printed by
//! `main` whatever the level.

use std::fmt::Display;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicI8, Ordering};
use std::time::Duration;

use indicatif::{HumanDuration, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// -1: `-q`; 0: default; 1 and up: `-v`.
static LEVEL: AtomicI8 = AtomicI8::new(0);

pub fn set_level(quiet: bool, verbose: u8) {
    let level = if quiet { -1 } else { verbose.min(8) as i8 };
    LEVEL.store(level, Ordering::Relaxed);
}

pub fn quiet() -> bool {
    LEVEL.load(Ordering::Relaxed) < 0
}

pub fn verbose() -> bool {
    LEVEL.load(Ordering::Relaxed) > 0
}

/// A line on stderr for a person (a summary, a note), unless `-q`.
pub fn note(msg: impl Display) {
    if !quiet() {
        eprintln!("{msg}");
    }
}

/// A line on stderr only under `-v` (the backend choice, timings of parts).
pub fn detail(msg: impl Display) {
    if verbose() {
        eprintln!("{msg}");
    }
}

/// No ETA before this much time has passed or this fraction is done: before that there is no
/// rate to extrapolate from, and indicatif's estimate is absurd.
const ETA_AFTER: Duration = Duration::from_secs(1);
const ETA_AFTER_FRACTION: f32 = 0.02;

/// A progress bar over `total` bytes on stderr, in decimal units (kB, MB: those of the
/// README's MB/s), with an ETA once there is a rate. Hidden when `hidden` (a `--json` run),
/// under `-q`, or when stderr is not a terminal.
pub fn bar(total: u64, hidden: bool, what: &str) -> ProgressBar {
    if hidden || quiet() || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:>10} [{wide_bar}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec}{eta_once_known}",
        )
        .expect("valid template")
        .with_key("eta_once_known", eta_once_known)
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    // Long steps (a text segment, a large tensor) would otherwise freeze the elapsed time.
    pb.enable_steady_tick(Duration::from_millis(250));
    pb
}

fn eta_once_known(s: &ProgressState, w: &mut dyn std::fmt::Write) {
    let f = s.fraction();
    if s.elapsed() >= ETA_AFTER && (ETA_AFTER_FRACTION..1.0).contains(&f) {
        let _ = write!(w, " eta {}", HumanDuration(s.eta()));
    }
}
