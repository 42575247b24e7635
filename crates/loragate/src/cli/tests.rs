//! The command line's parsing: defaults, flags, and what reaches the configurations.

use loragate_core::Key;
use loragate_engine::Device;
use loragate_fleet::WorkerAddress;

use super::*;
use crate::model::ModelSource;

#[test]
fn serve_defaults_match_the_contract() {
    let Cli { command: Command::Serve(args), .. } = Cli::parse_from(["loragate", "serve"]) else {
        panic!("serve parses");
    };
    assert!(args.model.is_none() && args.adapters.is_empty());
    let config = args.into_config();
    assert_eq!(config.grpc_addr, "127.0.0.1:50051".parse().expect("address"));
    assert_eq!(config.http_addr, "127.0.0.1:8000".parse().expect("address"));
    assert!(matches!(config.model, ModelSource::Demo { .. }));
    assert_eq!((config.engine.max_lora_rank, config.engine.max_adapter_bytes), (64, 1 << 30));
    assert_eq!(config.engine.adapter_load_timeout, Duration::from_secs(120));
    assert_eq!(config.state, StateLocation::UserDefault, "durable by default");
    assert_eq!(config.engine.max_num_batched_tokens, None, "sized to the device when the engine starts");
    assert_eq!(config.engine.kv_cache_memory_bytes, None, "sized to the machine when the engine starts");
    assert!(config.engine.enable_prefix_caching, "prefix caching is on by default");
    assert_eq!(config.engine.max_step_slowdown, Some(loragate_engine::StepTarget::DEFAULT), "the step target is on");
}

#[test]
fn the_step_target_takes_a_factor_or_off() {
    let engine = |flags: &[&str]| {
        let cli = Cli::try_parse_from([&["loragate", "serve"][..], flags].concat()).expect("parses");
        let Command::Serve(args) = cli.command else { panic!("serve") };
        args.into_config().engine
    };
    let target = engine(&["--max-step-slowdown", "2.5"]).max_step_slowdown.expect("a target");
    assert_eq!(target.factor(), 2.5);
    assert_eq!(engine(&["--max-step-slowdown", "off"]).max_step_slowdown, None);
    for bad in ["1", "fast"] {
        let err = Cli::try_parse_from(["loragate", "serve", "--max-step-slowdown", bad]).expect_err("refused");
        assert!(err.to_string().contains("max-step-slowdown"), "{err}");
    }
}

#[test]
fn the_kv_cache_flags_take_sizes_with_units_and_switch_prefix_caching_both_ways() {
    let engine = |flags: &[&str]| {
        let cli = Cli::try_parse_from([&["loragate", "serve"][..], flags].concat()).expect("parses");
        let Command::Serve(args) = cli.command else { panic!("serve") };
        args.into_config().engine
    };
    assert_eq!(engine(&["--kv-cache-memory-bytes", "4GiB"]).kv_cache_memory_bytes, Some(4 << 30));
    assert_eq!(engine(&["--kv-cache-memory-bytes", "1000000"]).kv_cache_memory_bytes, Some(1_000_000));
    assert!(!engine(&["--no-enable-prefix-caching"]).enable_prefix_caching);
    assert!(engine(&["--enable-prefix-caching"]).enable_prefix_caching);
    assert!(engine(&["--no-enable-prefix-caching", "--enable-prefix-caching"]).enable_prefix_caching, "the last wins");
    assert!(!engine(&["--enable-prefix-caching", "--no-enable-prefix-caching"]).enable_prefix_caching);
    let bad = Cli::try_parse_from(["loragate", "serve", "--kv-cache-memory-bytes", "lots"]).expect_err("refused");
    assert!(bad.to_string().contains("kv-cache-memory-bytes"), "{bad}");
    let worker = Cli::try_parse_from(["loragate", "worker", "--grpc-port", "1", "--kv-cache-memory-bytes", "2GiB"]);
    let Command::Worker(args) = worker.expect("parses").command else { panic!("worker") };
    assert_eq!(args.into_settings().engine.kv_cache_memory_bytes, Some(2 << 30), "worker takes the engine flags");
}

#[test]
fn state_dir_takes_a_directory_or_none() {
    let state = |args: &[&str]| {
        let Command::Serve(args) = Cli::try_parse_from(args).expect("parses").command else { panic!("serve") };
        args.into_config().state
    };
    assert_eq!(state(&["loragate", "serve", "--state-dir", "none"]), StateLocation::Memory);
    assert_eq!(
        state(&["loragate", "serve", "--state-dir", "/srv/lg"]),
        StateLocation::Directory(PathBuf::from("/srv/lg"))
    );
    let bad = Cli::try_parse_from(["loragate", "serve", "--state-dir", ""]).expect_err("empty");
    assert!(bad.to_string().contains("--state-dir"), "{bad}");
    let url = "etcd://127.0.0.1:2379,etcd-b:2379/lg";
    assert_eq!(
        state(&["loragate", "serve", "--state", url]),
        StateLocation::Shared(loragate_etcd::EtcdUrl::parse(url).expect("valid"))
    );
    let both = Cli::try_parse_from(["loragate", "serve", "--state", url, "--state-dir", "/srv/lg"]);
    assert!(both.expect_err("both").to_string().contains("--state-dir"), "one or the other");
    let bad = Cli::try_parse_from(["loragate", "serve", "--state", "etcd://h/lg"]).expect_err("no port");
    assert!(bad.to_string().contains("no :PORT"), "{bad}");
}

#[test]
fn a_replicas_lease_is_whole_seconds_of_at_least_two_and_needs_a_shared_state() {
    let etcd = ["loragate", "serve", "--state", "etcd://127.0.0.1:2379/lg"];
    assert_eq!(serve_config(&etcd).replica_lease, Duration::from_secs(5), "the default");
    assert_eq!(serve_config(&[&etcd[..], &["--replica-lease", "2s"]].concat()).replica_lease, Duration::from_secs(2));
    for bad in ["1s", "2500ms", "0", "soon"] {
        let err = Cli::try_parse_from([&etcd[..], &["--replica-lease", bad]].concat()).expect_err(bad);
        assert!(err.to_string().contains("--replica-lease"), "{bad}: {err}");
    }
    let alone = Cli::try_parse_from(["loragate", "serve", "--replica-lease", "3s"]).expect_err("without --state");
    assert!(alone.to_string().contains("--state"), "{alone}");
}

#[test]
fn adapters_are_name_equals_dir_and_repeatable() {
    let cli = Cli::try_parse_from([
        "loragate",
        "serve",
        "--model",
        "/m",
        "--adapter",
        "meow=/a/meow",
        "--adapter",
        "woof=/a/woof",
        "--adapter-root",
        "/a",
        "--gate-max-wait",
        "5s",
        "--device",
        "cuda:1",
        "--max-lora-rank",
        "16",
        "--max-adapter-bytes",
        "1000000",
        "--adapter-load-timeout",
        "5s",
    ])
    .expect("parses");
    let Command::Serve(args) = cli.command else { panic!("serve") };
    let names: Vec<_> = args.adapters.iter().map(|a| a.name.to_string()).collect();
    assert_eq!(names, vec!["meow", "woof"]);
    assert_eq!(args.gate.gate_max_wait, Duration::from_secs(5));
    assert_eq!(args.engine.device, Device::Cuda(1));
    let engine = args.into_config().engine;
    assert_eq!((engine.max_lora_rank, engine.max_adapter_bytes), (16, 1_000_000));
    assert_eq!(engine.adapter_load_timeout, Duration::from_secs(5));
    for bad in ["meow", "=dir", "bad name=dir", "meow="] {
        assert!(Cli::try_parse_from(["loragate", "serve", "--adapter", bad]).is_err(), "{bad}");
    }
}

#[test]
fn limits_connections_and_keys_have_the_issues_defaults_and_flags() {
    let Command::Serve(args) = Cli::parse_from(["loragate", "serve"]).command else { panic!("serve") };
    let config = args.into_config();
    assert_eq!(config.limits, Limits::default());
    assert_eq!((config.limits.max_in_flight, config.limits.max_held), (1024, 4096));
    assert_eq!(config.connections.max_connections, 4096);
    assert_eq!(
        (config.connections.header_read_timeout, config.connections.idle_timeout),
        (Duration::from_secs(10), Duration::from_secs(60))
    );
    assert!(config.authentication.api_key.is_none() || std::env::var_os("LORAGATE_API_KEY").is_some());

    let cli = Cli::try_parse_from([
        "loragate",
        "serve",
        "--max-in-flight",
        "8",
        "--max-held",
        "16",
        "--max-in-flight-per-adapter",
        "2",
        "--max-held-per-adapter",
        "4",
        "--max-connections",
        "32",
        "--header-read-timeout",
        "2s",
        "--idle-timeout",
        "5s",
        "--api-key",
        "k-api",
        "--admin-key",
        "k-admin",
        "--tenant-keys",
        "/etc/loragate/tenants.json",
    ])
    .expect("parses");
    let Command::Serve(args) = cli.command else { panic!("serve") };
    let config = args.into_config();
    let expected =
        Limits { max_in_flight: 8, max_held: 16, max_in_flight_per_adapter: Some(2), max_held_per_adapter: Some(4) };
    assert_eq!(config.limits, expected);
    assert_eq!((config.connections.max_connections, config.connections.idle_timeout), (32, Duration::from_secs(5)));
    assert_eq!(config.authentication.api_key, Some(Key::parse("k-api").expect("key")));
    assert!(!format!("{config:?}").contains("k-admin"), "keys are redacted from Debug output");
    assert!(Cli::try_parse_from(["loragate", "serve", "--api-key", "has space"]).is_err());
}

#[test]
fn serve_fronts_repeated_workers_and_checks_them_every_interval() {
    let Cli { command: Command::Serve(args), .. } = Cli::parse_from(["loragate", "serve"]) else { panic!("serve") };
    assert!(args.fleet.workers.is_empty(), "no worker: the in-process engine");
    assert_eq!(args.fleet.worker_health_interval, Duration::from_secs(2), "the default interval");
    let cli = Cli::try_parse_from([
        "loragate",
        "serve",
        "--worker",
        "http://127.0.0.1:9001",
        "--worker",
        "vllm+http://127.0.0.1:9002",
        "--worker",
        "sglang+http://Worker-3:9003/",
        "--worker-health-interval",
        "0.5",
        "--worker-failure-threshold",
        "5",
        "--worker-wait",
        "10",
        "--max-workers",
        "8",
        "--worker-adapter-root",
        "/mnt/adapters",
    ])
    .expect("parses");
    let Command::Serve(args) = cli.command else { panic!("serve") };
    let config = args.into_config();
    let workers: Vec<&str> = config.fleet.workers.iter().map(WorkerAddress::as_str).collect();
    assert_eq!(workers, ["grpc://127.0.0.1:9001", "vllm+http://127.0.0.1:9002", "sglang+http://worker-3:9003"]);
    assert_eq!(config.fleet.health_interval, Duration::from_millis(500));
    assert_eq!((config.fleet.failure_threshold, config.fleet.join_timeout), (5, Duration::from_secs(10)));
    assert_eq!(config.fleet.max_workers, 8);
    assert_eq!(config.fleet.worker_adapter_root.as_deref(), Some(std::path::Path::new("/mnt/adapters")));
    let bad = Cli::try_parse_from(["loragate", "serve", "--worker", "127.0.0.1:9001"]).expect_err("not a URL");
    assert!(bad.to_string().contains("--worker"), "{bad}");
    let secret = Cli::try_parse_from(["loragate", "serve", "--worker", "http://u:hunter2@h:1"]).expect_err("creds");
    assert!(!secret.to_string().contains("hunter2"), "{secret}");
    let defaults = Cli::parse_from(["loragate", "serve"]);
    let Command::Serve(args) = defaults.command else { panic!("serve") };
    let config = args.into_config();
    assert_eq!(
        (config.fleet.join_timeout, config.fleet.max_workers, config.fleet.failure_threshold),
        (Duration::from_secs(60), 256, 3)
    );
}

#[test]
fn worker_needs_an_address_and_takes_the_engine_flags() {
    assert!(Cli::try_parse_from(["loragate", "worker"]).is_err(), "--grpc-addr or --grpc-port is required");
    let by_port = |args: &[&str]| {
        let cli = Cli::try_parse_from([&["loragate", "worker"][..], args].concat()).expect("parses");
        let Command::Worker(args) = cli.command else { panic!("worker") };
        args.into_settings().grpc_addr
    };
    assert_eq!(by_port(&["--grpc-port", "9002"]), "127.0.0.1:9002".parse().expect("address"));
    assert_eq!(by_port(&["--host", "0.0.0.0", "--grpc-port", "9002"]), "0.0.0.0:9002".parse().expect("address"));
    let no_http = Cli::try_parse_from(["loragate", "worker", "--grpc-port", "9002"]).expect("parses");
    let Command::Worker(no_http) = no_http.command else { panic!("worker") };
    assert_eq!(no_http.into_settings().http_addr, None, "no HTTP listener unless asked for");
    for conflicting in [&["--grpc-addr", "127.0.0.1:1", "--grpc-port", "2"][..], &["--host", "0.0.0.0"][..]] {
        let err = Cli::try_parse_from([&["loragate", "worker"][..], conflicting].concat()).expect_err("refused");
        assert!(err.to_string().contains("--grpc"), "{err}");
    }
    let cli = Cli::try_parse_from([
        "loragate",
        "worker",
        "--grpc-addr",
        "127.0.0.1:9001",
        "--adapter-root",
        "/a",
        "--max-batch-size",
        "8",
        "--max-num-batched-tokens",
        "96",
        "--device",
        "cpu",
        "--http-addr",
        "localhost:9101",
    ])
    .expect("parses");
    let Command::Worker(args) = cli.command else { panic!("worker") };
    let settings = args.into_settings();
    assert_eq!(settings.grpc_addr, "127.0.0.1:9001".parse().expect("address"));
    assert_eq!(settings.http_addr, Some("127.0.0.1:9101".parse().expect("address")), "metrics over HTTP");
    assert_eq!(settings.engine.max_batch_size, 8);
    assert_eq!(settings.engine.max_num_batched_tokens, Some(96));
    assert_eq!(settings.adapter_root.as_deref(), Some(std::path::Path::new("/a")));
    assert!(matches!(settings.model, ModelSource::Demo { .. }));
    assert_eq!((settings.max_loras, settings.enable_shutdown_rpc), (None, false), "no cap, no Shutdown RPC");
    assert_eq!((settings.limits, settings.connections.max_connections), (Limits::default(), 4096), "serve's defaults");
}

#[test]
fn worker_takes_serves_limit_connection_and_key_flags() {
    let cli = Cli::try_parse_from([
        "loragate",
        "worker",
        "--grpc-addr",
        "0.0.0.0:9001",
        "--gate-max-wait",
        "3s",
        "--max-in-flight",
        "8",
        "--max-held",
        "16",
        "--max-connections",
        "32",
        "--header-read-timeout",
        "2s",
        "--idle-timeout",
        "5s",
        "--api-key",
        "k-api",
        "--admin-key",
        "k-admin",
        "--max-loras",
        "4",
        "--enable-shutdown-rpc",
    ])
    .expect("parses");
    let Command::Worker(args) = cli.command else { panic!("worker") };
    let settings = args.into_settings();
    assert_eq!(settings.deadlines.gate_max_wait, Duration::from_secs(3));
    assert_eq!((settings.limits.max_in_flight, settings.limits.max_held), (8, 16));
    assert_eq!(settings.connections.max_connections, 32);
    assert_eq!(
        (settings.connections.header_read_timeout, settings.connections.idle_timeout),
        (Duration::from_secs(2), Duration::from_secs(5))
    );
    assert_eq!(settings.authentication.admin_key, Some(Key::parse("k-admin").expect("key")));
    assert_eq!(settings.authentication.api_key, Some(Key::parse("k-api").expect("key")));
    assert_eq!((settings.max_loras, settings.enable_shutdown_rpc), (Some(4), true));
    assert!(Cli::try_parse_from(["loragate", "worker", "--grpc-addr", "127.0.0.1:1", "--max-loras", "0"]).is_err());

    let cli = Cli::try_parse_from(["loragate", "serve", "--worker", "grpc://h:1", "--worker-key", "k-admin"]);
    let Command::Serve(args) = cli.expect("parses").command else { panic!("serve") };
    assert_eq!(args.into_config().fleet.worker_key, Some(Key::parse("k-admin").expect("key")));
}

#[test]
fn tinker_flags_reach_the_tinker_front() {
    let Cli { command: Command::Serve(defaults), .. } = Cli::parse_from(["loragate", "serve"]) else { panic!("serve") };
    let defaults = defaults.into_config().tinker;
    assert_eq!((defaults.max_pause_wait, defaults.poll_hold), (Duration::from_secs(1800), Duration::from_secs(25)));
    let cli = Cli::try_parse_from([
        "loragate",
        "serve",
        "--tinker-max-pause-wait",
        "10m",
        "--tinker-max-pending",
        "7",
        "--tinker-poll-hold",
        "5s",
    ])
    .expect("parses");
    let Command::Serve(args) = cli.command else { panic!("serve") };
    let tinker = args.into_config().tinker;
    assert_eq!(tinker.max_pause_wait, Duration::from_secs(600));
    assert_eq!(tinker.retention.max_pending, 7);
    assert_eq!(tinker.poll_hold, Duration::from_secs(5));
}

fn serve_config(args: &[&str]) -> ServeConfig {
    let cli = Cli::try_parse_from(args).unwrap_or_else(|err| panic!("{args:?}: {err}"));
    let Command::Serve(args) = cli.command else { panic!("serve") };
    args.into_config()
}

#[test]
fn vllms_host_and_port_flags_and_host_names_choose_the_addresses() {
    let addresses = |args: &[&str]| {
        let config = serve_config(&[&["loragate", "serve"][..], args].concat());
        (config.http_addr.to_string(), config.grpc_addr.to_string())
    };
    assert_eq!(addresses(&[]), ("127.0.0.1:8000".into(), "127.0.0.1:50051".into()));
    assert_eq!(addresses(&["--host", "0.0.0.0"]), ("0.0.0.0:8000".into(), "0.0.0.0:50051".into()));
    assert_eq!(
        addresses(&["--port", "9000", "--grpc-port", "9001"]),
        ("127.0.0.1:9000".into(), "127.0.0.1:9001".into())
    );
    assert_eq!(addresses(&["--host", "localhost", "--port", "0"]), ("127.0.0.1:0".into(), "127.0.0.1:50051".into()));
    assert_eq!(
        addresses(&["--http-addr", "localhost:8001", "--grpc-addr", "[::1]:50052"]),
        ("127.0.0.1:8001".into(), "[::1]:50052".into())
    );
    assert_eq!(
        addresses(&["--http-addr", "127.0.0.1:7", "--grpc-port", "8"]),
        ("127.0.0.1:7".into(), "127.0.0.1:8".into())
    );
    for clash in [
        &["--http-addr", "127.0.0.1:1", "--port", "2"][..],
        &["--grpc-addr", "127.0.0.1:1", "--grpc-port", "2"],
        &["--host", "0.0.0.0", "--http-addr", "127.0.0.1:1"],
    ] {
        let err = Cli::try_parse_from([&["loragate", "serve"][..], clash].concat()).expect_err("one address, one way");
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict, "{clash:?}: {err}");
    }
    let err = Cli::try_parse_from(["loragate", "serve", "--http-addr", "localhost"]).expect_err("no port");
    assert!(err.to_string().contains("--http-addr") && err.to_string().contains("HOST:PORT"), "{err}");
}

#[test]
fn vllms_spellings_of_the_context_length_and_the_adapters_are_accepted() {
    let config = serve_config(&["loragate", "serve", "--max-model-len", "2048"]);
    assert_eq!(config.engine.max_context_length, Some(2048));
    let config = serve_config(&[
        "loragate",
        "serve",
        "--adapter",
        "meow=/a/meow",
        "--lora-modules",
        "woof=/a/woof",
        r#"{"name": "purr", "path": "/a/purr", "base_model_name": "demo"}"#,
        "--max-in-flight",
        "8",
    ]);
    let adapters: Vec<(String, String)> =
        config.adapters.initial.iter().map(|a| (a.name.to_string(), a.dir.display().to_string())).collect();
    let expected = [("meow", "/a/meow"), ("woof", "/a/woof"), ("purr", "/a/purr")];
    assert_eq!(adapters, expected.map(|(name, dir)| (name.to_owned(), dir.to_owned())));
    assert_eq!(config.limits.max_in_flight, 8, "the flag after the modules is a flag");
    for bad in
        [r#"{"name": "purr"}"#, r#"{"name": "purr", "path": "/p", "rank": 8}"#, "purr", r#"{"name": 1, "path": "/p"}"#]
    {
        let err = Cli::try_parse_from(["loragate", "serve", "--lora-modules", bad]).expect_err(bad);
        assert!(err.to_string().contains("--lora-modules"), "{bad}: {err}");
    }
    let worker = Cli::try_parse_from(["loragate", "worker", "--grpc-addr", "localhost:9001", "--max-model-len", "64"])
        .expect("the worker takes host names and --max-model-len");
    let Command::Worker(args) = worker.command else { panic!("worker") };
    let settings = args.into_settings();
    assert_eq!(settings.grpc_addr.to_string(), "127.0.0.1:9001");
    assert_eq!(settings.engine.max_context_length, Some(64));
}

#[test]
fn defaults_are_stated_once_and_the_version_is_printed() {
    let Cli { command: Command::Serve(args), log_format, access_log } = Cli::parse_from(["loragate", "serve"]) else {
        panic!("serve")
    };
    assert_eq!((log_format, access_log), (LogFormat::Text, false));
    let logged = Cli::try_parse_from(["loragate", "serve", "--access-log"]).expect("--access-log parses");
    assert!(logged.access_log);
    assert_eq!(args.engine.compute_threads, None, "the default is computed at start, not shown as a number");
    assert!(args.engine.compute_threads() >= 1);
    assert_eq!(args.into_config().log_stats_interval, Some(Duration::from_secs(10)));
    let config = serve_config(&["loragate", "serve", "--log-stats-interval", "0", "--log-format", "json"]);
    assert_eq!(config.log_stats_interval, None, "0 turns the stats line off");
    let json = Cli::try_parse_from(["loragate", "--log-format", "json", "worker", "--grpc-addr", "127.0.0.1:0"]);
    assert_eq!(json.expect("a global flag").log_format, LogFormat::Json);
    assert!(Cli::try_parse_from(["loragate", "serve", "--compute-threads", "0"]).is_err(), "at least one thread");

    let version = Cli::try_parse_from(["loragate", "--version"]).expect_err("prints the version");
    assert_eq!(version.kind(), clap::error::ErrorKind::DisplayVersion);
    assert_eq!(version.to_string().trim(), format!("loragate {}", env!("CARGO_PKG_VERSION")));

    // One default per flag: a flag with a default value does not state another in its help.
    let command = <Cli as clap::CommandFactory>::command();
    for subcommand in command.get_subcommands() {
        for arg in subcommand.get_arguments() {
            let help = arg.get_long_help().or(arg.get_help()).map(ToString::to_string).unwrap_or_default();
            let stated = help.to_lowercase().contains("default");
            assert!(
                arg.get_default_values().is_empty() || !stated,
                "{} --{}: a default value and a default in its help: {help}",
                subcommand.get_name(),
                arg.get_id()
            );
        }
    }
}

#[test]
fn demo_model_takes_an_output_directory() {
    let cli = Cli::try_parse_from(["loragate", "demo-model", "--out", "/tmp/demo"]).expect("parses");
    assert!(matches!(cli.command, Command::DemoModel { out } if out == std::path::Path::new("/tmp/demo")));
    assert!(Cli::try_parse_from(["loragate", "demo-model"]).is_err(), "--out is required");
}

#[test]
fn agent_takes_a_directory_an_address_and_an_optional_key() {
    let cli = Cli::try_parse_from(["loragate", "agent", "--adapter-dir", "/srv/a", "--http-addr", "127.0.0.1:9100"]);
    let Command::Agent(args) = cli.expect("parses").command else { panic!("the agent subcommand") };
    let settings = args.into_settings();
    assert_eq!(settings.adapter_dir, std::path::Path::new("/srv/a"));
    assert_eq!(settings.http_addr.to_string(), "127.0.0.1:9100");
    assert!(settings.api_key.is_none());
    assert_eq!(settings.max_adapter_bytes, 1 << 30);
    let keyed = ["loragate", "agent", "--adapter-dir", "d", "--http-addr", "127.0.0.1:0", "--api-key", "k"];
    let Command::Agent(args) = Cli::try_parse_from(keyed).expect("parses").command else { panic!("agent") };
    assert_eq!(args.api_key.expect("a key").expose_secret(), "k");
    assert!(Cli::try_parse_from(["loragate", "agent", "--http-addr", "127.0.0.1:0"]).is_err(), "--adapter-dir");
    assert!(Cli::try_parse_from(["loragate", "agent", "--adapter-dir", "d"]).is_err(), "--http-addr");
}

#[test]
fn serve_takes_vllms_lora_flags_and_caps_the_loaded_adapters() {
    assert_eq!(serve_config(&["loragate", "serve"]).adapters.max_loras, None, "no cap by default");
    let lora_flags = ["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "8", "--max-lora-rank", "16"];
    let config = serve_config(&[&["loragate", "serve"][..], &lora_flags].concat());
    assert_eq!((config.adapters.max_loras, config.engine.max_lora_rank), (Some(4), 16));
    for refused in [["--max-loras", "0"], ["--max-cpu-loras", "0"]] {
        let mut args = vec!["loragate", "serve"];
        args.extend(refused);
        assert!(Cli::try_parse_from(&args).is_err(), "{refused:?}");
    }
}
