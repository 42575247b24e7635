//! The coordinator's invariants over many randomised interleavings of samples, pauses, resumes, loads, waiters and
//! callers that go away.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomised_interleavings_keep_every_invariant() {
    for seed in 0..200u64 {
        run_interleaving(seed).await;
    }
}

async fn run_interleaving(seed: u64) {
    let watch = Arc::new(PauseWatch::default());
    let hook_watch = watch.clone();
    let engine = ScriptedEngine::new(HOLD_AFTER).with_generate_hook(Box::new(move |request, cancel| {
        let paused = hook_watch.paused.lock().get(request.adapter()).copied().unwrap_or(false);
        if paused && !cancel.is_cancelled() {
            hook_watch.violations.lock().push(format!(
                "{} admitted while {} was paused",
                request.id(),
                request.adapter()
            ));
        }
    }));
    let coordinator = coordinator_with(engine, &["meow", "woof"]).await;
    let adapters = ["meow", "woof", ""];
    let mut rng = StdRng::seed_from_u64(seed);

    // One trainer per adapter: abort, mark paused, (maybe load), unmark, resume — at random moments.
    let stop_trainers = Arc::new(AtomicBool::new(false));
    let reports: Arc<Mutex<Vec<(String, PauseReport)>>> = Arc::default();
    let trainers: Vec<_> = ["meow", "woof"]
        .into_iter()
        .enumerate()
        .map(|(index, adapter)| {
            let (coordinator, watch, stop, reports) =
                (coordinator.clone(), watch.clone(), stop_trainers.clone(), reports.clone());
            let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(index as u64 + 1));
            tokio::spawn(async move {
                let key = AdapterKey::parse(adapter).expect("key");
                while !stop.load(Ordering::Acquire) {
                    let report = coordinator.abort(&name(adapter)).await.expect("abort");
                    watch.paused.lock().insert(key.clone(), true);
                    reports.lock().push((adapter.to_owned(), report));
                    for _ in 0..rng.random_range(0..20) {
                        tokio::task::yield_now().await;
                    }
                    if rng.random_bool(0.3) {
                        let source = AdapterSource::trusted(format!("/a/{adapter}"));
                        coordinator.load_adapter(&name(adapter), source).await.expect("load while paused");
                    }
                    watch.paused.lock().insert(key.clone(), false);
                    coordinator.resume(&name(adapter), None).await.expect("resume");
                    for _ in 0..rng.random_range(0..20) {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();

    // Rollouts: samples of every kind, some dropped mid-way, and waiters.
    let mut samples = Vec::new();
    let mut waiters = Vec::new();
    for i in 0..60 {
        let adapter = adapters[rng.random_range(0..adapters.len())];
        let budget = if rng.random_bool(0.5) { SHORT } else { LONG };
        let id = format!("{}-{i}", if adapter.is_empty() { "base" } else { adapter });
        let task = spawn_sample(&coordinator, adapter, budget, &id);
        let dropped = rng.random_bool(0.15);
        samples.push((id, adapter, budget, task, dropped));
        if rng.random_bool(0.2) && !adapter.is_empty() {
            let (coordinator, lora) = (coordinator.clone(), name(adapter));
            let timeout = Duration::from_millis(rng.random_range(0..5));
            waiters.push(tokio::spawn(async move { coordinator.wait_unpaused(&lora, timeout).await }));
        }
        if rng.random_bool(0.3) {
            tokio::task::yield_now().await;
        }
    }
    for (_, _, _, task, dropped) in &samples {
        if *dropped {
            task.abort();
        }
    }

    stop_trainers.store(true, Ordering::Release);
    for trainer in trainers {
        joined(trainer).await;
    }
    // Reopen so every held request gets admitted, then end the long ones with a last abort of each adapter (the
    // base model is never aborted by a trainer).
    for adapter in ["meow", "woof"] {
        coordinator.resume(&name(adapter), None).await.expect("resume");
    }
    eventually("every unfinished request is admitted", || async {
        let unfinished = samples.iter().filter(|(.., task, _)| !task.is_finished()).count();
        let mut admitted = 0;
        for adapter in adapters {
            let status = status(&coordinator, adapter).await;
            if status.held > 0 {
                return false;
            }
            admitted += status.in_flight as usize;
        }
        admitted == unfinished
    })
    .await;
    let final_sweep = coordinator
        .adapter(&AdapterKey::Base)
        .expect("base")
        .pause(PauseRequest::new(PauseMode::Abort), Duration::from_secs(10), Instant::now())
        .await
        .expect("abort base");
    for adapter in ["meow", "woof"] {
        let report = coordinator.abort(&name(adapter)).await.expect("final abort");
        reports.lock().push((adapter.to_owned(), report));
    }

    let mut aborted_by_report: HashMap<String, String> = HashMap::new();
    for (adapter, report) in reports.lock().iter() {
        assert!(report.unacknowledged.is_empty(), "seed {seed}: {report:?}");
        for id in &report.aborted {
            assert!(id.as_str().starts_with(adapter.as_str()), "seed {seed}: aborting {adapter} aborted {id}");
            aborted_by_report.insert(id.to_string(), adapter.clone());
        }
    }
    let swept: HashSet<String> = final_sweep.aborted.iter().map(ToString::to_string).collect();
    for (id, adapter, budget, task, dropped) in samples {
        let result = tokio::time::timeout(Duration::from_secs(10), task).await.expect("no request is lost or hangs");
        let output = match result {
            Err(join) if dropped && join.is_cancelled() => continue,
            Err(join) => panic!("seed {seed}: {id} panicked: {join}"),
            Ok(output) => output.unwrap_or_else(|err| panic!("seed {seed}: {id} failed: {err}")),
        };
        let sequence = &output.sequences[0];
        match sequence.finish_reason {
            FinishReason::Length => {
                assert_eq!(budget, SHORT, "seed {seed}: {id} finished normally but only an abort ends it");
                assert!(!aborted_by_report.contains_key(&id), "seed {seed}: {id} reported aborted but completed");
                assert_eq!(sequence.token_ids.len(), SHORT as usize);
            }
            FinishReason::Abort => {
                assert!(
                    aborted_by_report.get(&id).is_some_and(|by| by == adapter)
                        || (adapter.is_empty() && swept.contains(&id)),
                    "seed {seed}: {id} ended aborted without an abort of {adapter:?} reporting it"
                );
                assert!(sequence.token_ids.len() <= HOLD_AFTER as usize);
                assert_eq!(sequence.token_ids, (0..sequence.token_ids.len() as u32).collect::<Vec<_>>());
            }
            FinishReason::Stop => panic!("seed {seed}: the scripted engine never stops"),
        }
    }
    for waiter in waiters {
        let _ = joined(waiter).await.expect("waiter answered");
    }
    assert!(watch.violations.lock().is_empty(), "seed {seed}: {:?}", watch.violations.lock());
    for adapter in ["meow", "woof"] {
        coordinator.resume(&name(adapter), None).await.expect("resume");
    }
    for adapter in adapters {
        eventually("every counter returns to zero", || async {
            let status = status(&coordinator, adapter).await;
            (status.in_flight, status.held, status.waiting) == (0, 0, 0)
        })
        .await;
    }
}
