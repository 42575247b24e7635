//! The `loragate` command: `loragate serve`, `loragate worker`, `loragate agent` and `loragate demo-model --out DIR`.

use std::process::ExitCode;

use clap::Parser;
use loragate::{Cli, Command, RunningAgent, RunningServer, RunningWorker};

fn main() -> ExitCode {
    let cli = Cli::parse();
    loragate::init_logging(cli.log_format, cli.access_log);
    loragate::return_large_frees_to_the_os();
    let compute_threads = match &cli.command {
        Command::Serve(args) => Some(args.engine.compute_threads()),
        Command::Worker(args) => Some(args.engine.compute_threads()),
        // On one compute thread, as `serve` generates the same files: candle sizing its work for every core inside
        // the generator's one-thread pool made it about 2.6x slower (125 s against 47 s on a loaded 2-core machine).
        Command::DemoModel { .. } => Some(1),
        Command::RandomAdapter { .. } | Command::Agent(_) => None,
    };
    if let Some(threads) = compute_threads {
        // SAFETY: no other thread exists yet: the async runtime starts below, and logging spawns none.
        #[allow(unsafe_code)]
        unsafe {
            loragate::set_compute_threads(threads);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("loragate: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve(*args).await,
            Command::Worker(args) => worker(*args).await,
            Command::Agent(args) => agent(args).await,
            Command::DemoModel { out } => {
                let cache_dir = loragate_engine::default_cache_dir();
                eprintln!(
                    "loragate: writing the demo model and its adapters to {} (copied from the demo cache in {}, \
                     generated there first if it has none: the adapters are trained)",
                    out.display(),
                    cache_dir.display()
                );
                let written =
                    tokio::task::spawn_blocking(move || loragate_engine::copy_demo_files(&cache_dir, &out)).await;
                match written {
                    Ok(Ok(files)) => {
                        println!("model:    {}", files.model_dir.display());
                        println!("adapters: {} (meow, woof)", files.adapters_dir.display());
                        Ok(())
                    }
                    Ok(Err(err)) => Err(err.to_string()),
                    Err(err) => Err(err.to_string()),
                }
            }
            Command::RandomAdapter { model, out, rank, alpha, b_std, seed } => {
                let adapter = loragate_engine::RandomAdapter { rank, alpha, b_std, seed };
                let shown = out.display().to_string();
                let written =
                    tokio::task::spawn_blocking(move || loragate_engine::write_random_adapter(&model, &out, &adapter))
                        .await;
                match written {
                    Ok(Ok(())) => {
                        println!("adapter: {shown} (random, seed {seed}, rank {rank})");
                        Ok(())
                    }
                    Ok(Err(err)) => Err(err.to_string()),
                    Err(err) => Err(err.to_string()),
                }
            }
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("loragate: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: loragate::ServeArgs) -> Result<(), String> {
    let server = RunningServer::start(args.into_config()).await.map_err(|err| err.to_string())?;
    let adapters: Vec<String> =
        server.coordinator().list_adapters().await.iter().map(|status| status.key.as_wire_str().to_owned()).collect();
    // One machine-readable line on stdout (logs go to stderr): tests and scripts learn the bound ports from it.
    println!(
        "{}",
        serde_json::json!({
            "event": "ready",
            "grpc_addr": server.grpc_addr().to_string(),
            "http_addr": server.http_addr().to_string(),
            "model": server.served_model_name(),
            "adapters": adapters,
            "state_dir": server.state_dir().map(|dir| dir.display().to_string()),
        })
    );
    server.run_until_signal().await.map_err(|err| err.to_string())
}

async fn worker(args: loragate::WorkerArgs) -> Result<(), String> {
    let worker = RunningWorker::start(args.into_settings()).await.map_err(|err| err.to_string())?;
    // The same machine-readable ready line as `serve`.
    println!(
        "{}",
        serde_json::json!({
            "event": "ready",
            "grpc_addr": worker.grpc_addr().to_string(),
            "http_addr": worker.http_addr().map(|addr| addr.to_string()),
            "model": worker.served_model_name(),
        })
    );
    worker.run_until_signal().await.map_err(|err| err.to_string())
}

async fn agent(args: loragate::AgentArgs) -> Result<(), String> {
    let agent = RunningAgent::start(args.into_settings()).await.map_err(|err| err.to_string())?;
    // The same machine-readable ready line as `serve`.
    println!(
        "{}",
        serde_json::json!({
            "event": "ready",
            "http_addr": agent.http_addr().to_string(),
            "adapter_dir": agent.adapter_dir().display().to_string(),
        })
    );
    agent.run_until_signal().await.map_err(|err| err.to_string())
}
