//! The `profcol` command line.

mod kernel_symbols_cli;
mod user_symbols_cli;

use anyhow::Context;
use clap::{Parser, Subcommand};
use profcol::extensions::HostStatus;
use profcol::registry::Registry;
use profcol::self_telemetry::SelfTelemetry;
use profcol::service::{check, Service};
use profcol_config::{Config, ConfigErrors, Source};
use std::path::PathBuf;
use std::process::ExitCode;
use tracing::{debug, error, info, warn};

/// profcol: a profiling collector. Receivers, processors and exporters wired
/// into pipelines by a YAML file, as in the OpenTelemetry Collector.
#[derive(Parser)]
#[command(name = "profcol", version, about)]
struct Cli {
    /// Config file; repeat to merge several in order (maps deep-merged, lists
    /// replaced). Without one, the embedded default (examples/default.yaml) runs.
    #[arg(long = "config", short = 'c', global = true, value_name = "FILE")]
    config: Vec<PathBuf>,
    /// Override one setting, e.g. --set processors.batch.timeout=2s (repeatable).
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    set: Vec<String>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Check the configuration and exit (0: valid, 1: invalid).
    Validate,
    /// List the built-in components: type, kind, stability.
    Components,
    /// Print the effective configuration (defaults filled, env expanded, secrets redacted).
    PrintConfig,
    /// Print the JSON Schema of the configuration (for editors' YAML language servers).
    Schema {
        /// Print the component reference of docs/CONFIG.md instead.
        #[arg(long)]
        markdown: bool,
    },
    /// Inspect or try out a WebAssembly plugin.
    Plugin {
        #[command(subcommand)]
        cmd: PluginCmd,
    },
    /// Resolve kernel addresses and inspect the kernel symbol store.
    KernelSymbols {
        #[command(subcommand)]
        cmd: kernel_symbols_cli::KernelSymbolsCmd,
    },
    /// Name addresses of user-space binaries as the user_symbols processor does.
    Symbols {
        #[command(subcommand)]
        cmd: user_symbols_cli::SymbolsCmd,
    },
}

#[derive(Subcommand)]
enum PluginCmd {
    /// Print a plugin's world, WIT version, imports, exports and size.
    Inspect { path: PathBuf },
    /// Run a plugin once on a batch and print what it did (its stdout and
    /// stderr show). Here `--config` takes the plugin's config as JSON (default {}).
    Run {
        path: PathBuf,
        /// The batch: OTLP ProfilesData protobuf, or OTLP/JSON when it ends in .json.
        #[arg(long, value_name = "BATCH.pb")]
        input: PathBuf,
        /// Limit of the call.
        #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = humantime::parse_duration)]
        call_timeout: std::time::Duration,
    },
}

fn sources(cli: &Cli) -> Vec<Source> {
    if cli.config.is_empty() {
        vec![Source::Text {
            name: "<embedded default: examples/default.yaml>".into(),
            text: profcol::DEFAULT_CONFIG.into(),
        }]
    } else {
        cli.config.iter().cloned().map(Source::File).collect()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Loads and checks the configuration against the registry.
fn load(cli: &Cli, registry: &Registry) -> Result<(Config, check::CheckedComponents), ConfigErrors> {
    let (config, mut errors) = profcol_config::load_partial(&sources(cli), &cli.set, &env);
    let Some(config) = config else { return Err(ConfigErrors(errors)) };
    profcol_plugins::set_cache_dir(config.service.plugins.cache_dir.clone());
    match check::check(&config, registry) {
        Ok(checked) if errors.is_empty() => Ok((config, checked)),
        Ok(_) => Err(ConfigErrors(errors)),
        Err(ConfigErrors(mut more)) => {
            errors.append(&mut more);
            errors.sort_by(|a, b| {
                let key =
                    |e: &profcol_config::ConfigError| e.position.as_ref().map(|p| (p.file.clone(), p.line, p.column));
                key(a).cmp(&key(b))
            });
            Err(ConfigErrors(errors))
        }
    }
}

/// What the instance id derives from: the config files (absolute), or the embedded default.
fn source_names(cli: &Cli) -> Vec<String> {
    if cli.config.is_empty() {
        return vec!["<embedded default>".into()];
    }
    cli.config.iter().map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()).display().to_string()).collect()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let status = HostStatus::default();
    let registry = Registry::builtin(&status);
    match cli.cmd {
        Some(Cmd::Components) => {
            println!("{:<16} {:<10} {:<12} DESCRIPTION", "TYPE", "KIND", "STABILITY");
            for f in registry.all() {
                let m = f.meta();
                println!("{:<16} {:<10} {:<12} {}", m.type_name, m.kind, m.stability, m.description);
            }
            ExitCode::SUCCESS
        }
        Some(Cmd::Schema { markdown }) => {
            let s = profcol::schema::schema(&registry);
            if markdown {
                print!("{}", profcol::schema::reference_markdown(&s));
            } else {
                println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            }
            ExitCode::SUCCESS
        }
        Some(Cmd::Plugin { cmd }) => {
            let r = match cmd {
                PluginCmd::Inspect { path } => profcol_plugins::cli::inspect_file(&path),
                PluginCmd::Run { path, input, call_timeout } => match cli.config.as_slice() {
                    [] => profcol_plugins::cli::run_file(&path, &input, None, call_timeout),
                    [json] => profcol_plugins::cli::run_file(&path, &input, json.to_str(), call_timeout),
                    _ => Err("plugin run takes one --config (the plugin's config as JSON)".into()),
                },
            };
            match r {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Some(Cmd::KernelSymbols { cmd }) => match kernel_symbols_cli::run(cmd) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        },
        Some(Cmd::Symbols { cmd }) => match user_symbols_cli::run(cmd) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        },
        Some(Cmd::Validate) => match load(&cli, &registry) {
            Ok(_) => {
                println!("configuration is valid");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprint!("{e}");
                ExitCode::from(1)
            }
        },
        Some(Cmd::PrintConfig) => match load(&cli, &registry) {
            Ok((config, checked)) => {
                print!("{}", profcol::print_config::render(&config, &checked));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprint!("{e}");
                ExitCode::from(1)
            }
        },
        None => {
            let (config, checked) = match load(&cli, &registry) {
                Ok(x) => x,
                Err(e) => {
                    eprint!("{e}");
                    return ExitCode::from(1);
                }
            };
            // A long-running agent: the loader's relocation table is not read
            // again, nor the code and data that read and checked the
            // configuration; and the host gives its pages back as it goes.
            profcol::loader_pages::drop_relocation_table();
            profcol::loader_pages::drop_read_only();
            profcol::loader_pages::give_back_read_only();
            let runtime = &config.service.runtime;
            if let Some(n) = runtime.malloc_arenas {
                limit_malloc_arenas(n);
            }
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if let Some(n) = runtime.worker_threads {
                builder.worker_threads(n);
            }
            let rt = match builder.enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            // The OTLP transports of the self-telemetry run on the runtime.
            let started = {
                let _in_runtime = rt.enter();
                SelfTelemetry::start(&config.service.telemetry, &source_names(&cli))
            };
            let telemetry = match started {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: service::telemetry: {e:#}");
                    return ExitCode::from(1);
                }
            };
            telemetry.init_logging(&config.service.telemetry.logs);
            if let Some(p) = telemetry.tracer_provider() {
                profcol::service::batch_trace::install(p);
            }
            let result = rt.block_on(run(cli, registry, status, config, checked, &telemetry));
            // Last logs, spans and metrics out while the runtime still runs.
            telemetry.shutdown();
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    error!("{e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// `service.runtime.malloc_arenas`: set before the runtime's threads start,
/// so none of them has an arena beyond the limit.
fn limit_malloc_arenas(n: u32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt has no preconditions; M_ARENA_MAX takes any positive count.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, n.min(i32::MAX as u32) as i32);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = n;
}

async fn run(
    cli: Cli,
    registry: Registry,
    status: HostStatus,
    config: Config,
    checked: check::CheckedComponents,
    self_telemetry: &SelfTelemetry,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let telemetry = self_telemetry.metrics.clone();
    let running_telemetry = config.service.telemetry.clone();
    for address in profcol::telemetry_server::pull_addresses(&config.service.telemetry) {
        profcol::telemetry_server::serve(&address, telemetry.clone()).await?;
    }
    let mut sigterm = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("cannot install the SIGHUP handler")?;
    let mut service = Service::new(registry, telemetry, status);
    let pipelines: Vec<String> = config.pipelines.keys().cloned().collect();
    service.start(config, checked).await.context("cannot start")?;
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    info!(pipelines = ?pipelines, workers, "profcol started");
    // Start-up's code and data are not used again (a reload uses some once
    // more): dropped now, and once more when the components' own start-up
    // work, which goes on after their start returned, is over. (Before each
    // receiver's start and as batches arrive, the host drops them too.)
    profcol::loader_pages::drop_read_only();
    tokio::spawn(async {
        tokio::time::sleep(profcol::loader_pages::STARTUP_CODE_SETTLE).await;
        let dropped = profcol::loader_pages::drop_read_only();
        debug!(kib = dropped / 1024, "code and read-only data pages dropped from the mappings after start-up");
    });
    loop {
        tokio::select! {
            _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { info!("SIGINT: shutting down"); break; }
            _ = sighup.recv() => {
                info!("SIGHUP: reloading the configuration");
                match load(&cli, service.registry()) {
                    Err(e) => warn!("reload failed; keeping the running configuration: {}", e.to_string().trim_end()),
                    Ok((config, checked)) => {
                        if config.service.telemetry != running_telemetry {
                            warn!("service::telemetry changed; it takes effect at the next start");
                        }
                        match service.reload(config, checked).await {
                            Ok(()) => info!("configuration reloaded"),
                            Err(e) => warn!("reload failed; keeping the running configuration: {e}"),
                        }
                    }
                }
            }
        }
    }
    service.shutdown().await;
    Ok(())
}
