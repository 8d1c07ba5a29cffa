//! The `spate-bench` binary: parse flags, run, print and write reports, map errors to exit codes.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;

use spate_bench::cli::{Cli, Command, CompareArgs, RunArgs};
use spate_bench::report::{console, csv, html, json};
use spate_bench::{compare, runner};

/// Exit code when the run was interrupted (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = 130;
/// Exit code when --validate found violations.
const EXIT_VALIDATION_FAILED: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stop = Arc::new(AtomicBool::new(false));
    watch_ctrl_c(Arc::clone(&stop));
    let result = match &cli.command {
        Some(Command::Compare(args)) => run_compare(args, &stop),
        Some(Command::Consume(args)) => run_follow(args, &stop),
        None => run_single(&cli.run, &stop),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("spate-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// First Ctrl-C: stop gracefully and still report. Second: exit at once.
fn watch_ctrl_c(stop: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new().name("ctrl-c".into()).spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_io().build() else {
            return;
        };
        rt.block_on(async {
            while tokio::signal::ctrl_c().await.is_ok() {
                if stop.swap(true, Ordering::SeqCst) {
                    eprintln!("\nspate-bench: interrupted twice, exiting without a report");
                    std::process::exit(i32::from(EXIT_INTERRUPTED));
                }
                eprintln!("\nspate-bench: stopping (waiting for outstanding acknowledgements; Ctrl-C again to quit now)");
            }
        });
    });
    if spawned.is_err() {
        eprintln!("spate-bench: warning: Ctrl-C handler unavailable");
    }
}

/// `spate-bench consume`: a long-running group consumer with a Prometheus endpoint.
fn run_follow(args: &spate_bench::cli::ConsumeArgs, stop: &AtomicBool) -> Result<ExitCode> {
    let metrics = spate_bench::follow::run(&args.to_config(), stop)?;
    println!(
        "consumed {} records; lag at the end {}",
        metrics.consumed_total(),
        metrics.lag_total()
    );
    Ok(ExitCode::SUCCESS)
}

fn run_single(args: &RunArgs, stop: &AtomicBool) -> Result<ExitCode> {
    let cfg = args.to_config()?;
    let report = runner::run(&cfg, stop)?;
    print!("{}", console::render_run(&report));
    if let Some(path) = &args.json_output {
        json::write(&report, path).with_context(|| format!("JSON report {}", path.display()))?;
    }
    if let Some(path) = &args.csv_output {
        csv::append_run(&report, path).with_context(|| format!("CSV report {}", path.display()))?;
    }
    Ok(if report.validation.as_ref().is_some_and(|v| !v.passed) {
        ExitCode::from(EXIT_VALIDATION_FAILED)
    } else if report.interrupted {
        ExitCode::from(EXIT_INTERRUPTED)
    } else {
        ExitCode::SUCCESS
    })
}

fn run_compare(args: &CompareArgs, stop: &AtomicBool) -> Result<ExitCode> {
    let report = compare::run_compare(args, stop)?;
    print!("{}", console::render_compare(&report));
    html::write(&report, &args.html_output)?;
    eprintln!("HTML report: {}", args.html_output.display());
    if let Some(path) = &args.json_output {
        json::write(&report, path)?;
    }
    if let Some(path) = &args.csv_output {
        csv::write_compare(&report, path)?;
    }
    let failed = report.cases.iter().flat_map(|c| &c.results).any(|r| {
        r.run.is_none()
            || r.run
                .as_ref()
                .and_then(|x| x.validation.as_ref())
                .is_some_and(|v| !v.passed)
    });
    Ok(if failed {
        ExitCode::from(EXIT_VALIDATION_FAILED)
    } else if report.interrupted {
        ExitCode::from(EXIT_INTERRUPTED)
    } else {
        ExitCode::SUCCESS
    })
}
