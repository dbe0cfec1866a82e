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
use tracing::{error, info, warn};

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
    /// Print a plugin's world, WIT version, imports, exports and size, and
    /// whether this profcol can run it.
    Inspect { path: PathBuf },
    /// Run a plugin once on a batch and print what it did (its stdout and
    /// stderr show), with the limits and grants of a `wasm/NAME` component.
    Run {
        path: PathBuf,
        /// The batch: OTLP ProfilesData protobuf, or OTLP/JSON when it ends
        /// in .json (`profcol plugin gen-batch` writes one).
        #[arg(long, value_name = "BATCH.pb")]
        input: PathBuf,
        /// The plugin's `config`, as JSON (default: none, `null`).
        #[arg(long, value_name = "JSON")]
        plugin_config: Option<String>,
        /// Limit of the call (`call_timeout`).
        #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = humantime::parse_duration)]
        call_timeout: std::time::Duration,
        /// Linear memory the instance may grow to (`memory_limit`: 64MiB, 1GiB, bytes).
        #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = profcol_plugins::config::parse_size)]
        memory_limit: u64,
        /// An environment variable the plugin may read (`allow.env`; repeatable).
        #[arg(long, value_name = "NAME")]
        allow_env: Vec<String>,
        /// A directory the plugin may read, as HOST_DIR:/PATH_IT_SEES (`allow.dirs`; repeatable).
        #[arg(long, value_name = "HOST:GUEST", value_parser = profcol_plugins::cli::parse_allow_dir)]
        allow_dir: Vec<(PathBuf, String)>,
    },
    /// Write a test batch for `plugin run`: a CPU profile as the eBPF
    /// receiver makes one (processes, deep stacks, kernel frames, threads).
    GenBatch {
        /// Samples in the batch.
        #[arg(long, default_value_t = 1000)]
        samples: usize,
        /// Where to write it: OTLP protobuf, or OTLP/JSON when it ends in .json.
        #[arg(long, short = 'o', value_name = "FILE", default_value = "batch.pb")]
        output: PathBuf,
    },
    /// Make a new processor plugin crate (Rust, the SDK, a test) in directory NAME.
    New {
        name: String,
        /// The SDK: PROFCOL_CHECKOUT/plugins/sdk (default: the one this profcol was built from, if it is there).
        #[arg(long, value_name = "DIR")]
        sdk: Option<PathBuf>,
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
    profcol_plugins::set_perf_map(config.service.plugins.perf_map);
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

/// A command that failed: what goes to stderr; the exit code is 1.
struct Failed(String);

impl Failed {
    /// `error: MESSAGE`.
    fn error(e: impl std::fmt::Display) -> Failed {
        Failed(format!("error: {e}\n"))
    }
}

/// Configuration errors print as they are: one per line, with file:line:column.
impl From<ConfigErrors> for Failed {
    fn from(e: ConfigErrors) -> Failed {
        Failed(e.to_string())
    }
}

/// What each command prints on success goes to stdout; a failure, to stderr, exit code 1.
fn exit_code(result: Result<String, Failed>) -> ExitCode {
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(Failed(text)) => {
            eprint!("{text}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    let status = HostStatus::default();
    let registry = Registry::builtin(&status);
    let result = match cli.cmd.take() {
        None => agent(cli, registry, status),
        Some(Cmd::Validate) => {
            load(&cli, &registry).map(|_| "configuration is valid\n".to_owned()).map_err(Failed::from)
        }
        Some(Cmd::PrintConfig) => load(&cli, &registry)
            .map(|(config, checked)| profcol::print_config::render(&config, &checked))
            .map_err(Failed::from),
        Some(Cmd::Components) => Ok(components(&registry)),
        Some(Cmd::Schema { markdown }) => Ok(schema(&registry, markdown)),
        Some(Cmd::Plugin { cmd }) => plugin(cmd, &cli.config),
        Some(Cmd::KernelSymbols { cmd }) => {
            kernel_symbols_cli::run(cmd).map(|()| String::new()).map_err(|e| Failed::error(format!("{e:#}")))
        }
        Some(Cmd::Symbols { cmd }) => {
            user_symbols_cli::run(cmd).map(|()| String::new()).map_err(|e| Failed::error(format!("{e:#}")))
        }
    };
    exit_code(result)
}

fn components(registry: &Registry) -> String {
    let mut out = format!("{:<16} {:<10} {:<12} DESCRIPTION\n", "TYPE", "KIND", "STABILITY");
    for f in registry.all() {
        let m = f.meta();
        out.push_str(&format!("{:<16} {:<10} {:<12} {}\n", m.type_name, m.kind, m.stability, m.description));
    }
    out
}

fn schema(registry: &Registry, markdown: bool) -> String {
    let s = profcol::schema::schema(registry);
    if markdown {
        profcol::schema::reference_markdown(&s)
    } else {
        serde_json::to_string_pretty(&s).unwrap_or_default() + "\n"
    }
}

/// `profcol plugin ...`. `config` is the global `--config`: before
/// `--plugin-config`, `plugin run` took the plugin's JSON there, and still does.
fn plugin(cmd: PluginCmd, config: &[PathBuf]) -> Result<String, Failed> {
    use profcol_plugins::cli;
    match cmd {
        PluginCmd::Inspect { path } => cli::inspect_file(&path),
        PluginCmd::Run { path, input, plugin_config, call_timeout, memory_limit, allow_env, allow_dir } => {
            let config_json = match (plugin_config, config) {
                (Some(json), []) => Some(json),
                (None, []) => None,
                (None, [json]) => Some(json.to_string_lossy().into_owned()),
                _ => return Err(Failed::error("plugin run takes the plugin's config once, as --plugin-config JSON")),
            };
            let allow = profcol_plugins::sandbox::Allow { env: allow_env, dirs: allow_dir.into_iter().collect() };
            let options = cli::RunOptions { config_json, call_timeout, memory_limit, allow };
            cli::run_file(&path, &input, &options)
        }
        PluginCmd::GenBatch { samples, output } => cli::gen_batch_file(samples, &output),
        PluginCmd::New { name, sdk } => {
            let built_from = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/sdk"));
            let sdk = sdk
                .or_else(|| built_from.is_dir().then_some(built_from))
                .ok_or_else(|| Failed::error("no SDK at hand: pass --sdk PROFCOL_CHECKOUT/plugins/sdk"))?;
            cli::new_plugin(&name, &sdk)
        }
    }
    .map_err(Failed::error)
}

/// Runs the agent: the configuration, the async runtime, self-telemetry,
/// then the service until SIGTERM or SIGINT.
fn agent(cli: Cli, registry: Registry, status: HostStatus) -> Result<String, Failed> {
    let (config, checked) = load(&cli, &registry)?;
    let runtime = &config.service.runtime;
    if let Some(n) = runtime.malloc_arenas {
        limit_malloc_arenas(n);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = runtime.worker_threads {
        builder.worker_threads(n);
    }
    let rt = builder.enable_all().build().map_err(|e| Failed::error(format!("cannot start the async runtime: {e}")))?;
    // The OTLP transports of the self-telemetry run on the runtime.
    let telemetry = {
        let _in_runtime = rt.enter();
        SelfTelemetry::start(&config.service.telemetry, &source_names(&cli))
    }
    .map_err(|e| Failed::error(format!("service::telemetry: {e:#}")))?;
    telemetry.init_logging(&config.service.telemetry.logs);
    if let Some(p) = telemetry.tracer_provider() {
        profcol::service::batch_trace::install(p);
    }
    let result = rt.block_on(run(cli, registry, status, config, checked, &telemetry));
    // Logging runs: the error is logged, and the last logs, spans and
    // metrics go out while the runtime still runs.
    if let Err(e) = &result {
        error!("{e:#}");
    }
    telemetry.shutdown();
    result.map(|()| String::new()).map_err(|_| Failed(String::new()))
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
