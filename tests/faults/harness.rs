//! A scenario's service and what it is held to: answers within the deadline, admissions within
//! the budget, correct decisions after the fault heals, no task, descriptor or connection left
//! behind; the `FAULT` line each prints.

use super::*;

/// Where the service's Redis lives, for counting connections.
pub struct Harness {
    pub name: &'static str,
    pub server: ServeProcess,
    pub client: RateLimitServiceClient<Channel>,
    /// Redis ports whose client connections are counted before and after.
    pub redis_ports: Vec<u16>,
    /// The most connections the service may hold to them once settled.
    pub redis_client_bound: u64,
    pub baseline: Resources,
    pub _serial: tokio::sync::MutexGuard<'static, ()>,
}

#[derive(Debug, Clone, Copy)]
pub struct Resources {
    pub tasks: f64,
    pub fds: f64,
    pub redis_clients: u64,
}

/// Clients connected to `port`, less the `redis-cli` asking.
pub fn redis_clients(port: u16) -> u64 {
    cli(port, &["INFO", "clients"])
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0, |n| n.saturating_sub(1))
}

pub struct Report {
    pub calls: usize,
    pub failure_answers: usize,
    pub worst: Duration,
    /// From the fault's start to the last failure-mode answer (zero: none).
    pub outage: Duration,
    /// From the heal to the last failure-mode answer (zero: none after it).
    pub recovery: Duration,
    /// Largest admissions of one hot key, and the sum over the hot keys that were used.
    pub most_admitted: u64,
    pub admitted: u64,
    pub keys_used: usize,
}

impl Harness {
    pub async fn start(name: &'static str, store_args: &[&str], redis_ports: Vec<u16>) -> Harness {
        let serial = SERIAL.lock().await;
        let dir = tempfile::tempdir().expect("temp dir").keep();
        std::fs::write(dir.join("faults.yaml"), RULES).expect("write rules");
        let mut args = vec![
            "--store",
            "redis",
            "--store-timeout",
            "100ms",
            "--failure-mode",
            "deny",
            "--log-level",
            "warn",
        ];
        args.extend_from_slice(store_args);
        let server = ServeProcess::spawn(&dir, &args, &[], &[]);
        let client = RateLimitServiceClient::connect(server.grpc_url())
            .await
            .expect("connect");
        let mut harness = Harness {
            name,
            server,
            client,
            redis_client_bound: 0,
            redis_ports,
            baseline: Resources {
                tasks: 0.0,
                fds: 0.0,
                redis_clients: 0,
            },
            _serial: serial,
        };
        harness
            .until_correct(Duration::from_secs(20), "at start")
            .await;
        harness.baseline = harness.resources().await;
        // Standalone and Sentinel: the connection set as it was. Cluster: the client may open one
        // connection to each node it learns of (replicas too, after a topology change).
        harness.redis_client_bound = if store_args.contains(&"--redis-cluster") {
            2 * harness.redis_ports.len() as u64
        } else {
            harness.baseline.redis_clients + 2
        };
        harness
    }

    pub async fn resources(&self) -> Resources {
        let (status, metrics) = http(self.server.admin_port, "GET", "/metrics", "").await;
        assert_eq!(status, 200);
        Resources {
            tasks: sample(&metrics, "portcullis_runtime_alive_tasks"),
            fds: sample(&metrics, "portcullis_process_open_fds"),
            redis_clients: self.redis_ports.iter().map(|p| redis_clients(*p)).sum(),
        }
    }

    /// A fresh probe key, decided by Redis, is answered 1 left, 0 left, then refused by the rule.
    pub async fn correct_now(&self, value: &str) -> bool {
        let mut client = self.client.clone();
        let mut answers = Vec::new();
        for _ in 0..3 {
            let r = client
                .should_rate_limit(request("faults", &[&[("probe", value)]]))
                .await
                .expect("answered")
                .into_inner();
            let reset = r.statuses[0]
                .duration_until_reset
                .as_ref()
                .map_or(0, |d| d.seconds);
            answers.push((r.overall_code, r.statuses[0].limit_remaining, reset > 1));
        }
        answers[0] == (OK, 1, true)
            && answers[1] == (OK, 0, true)
            && answers[2].0 == OVER
            && answers[2].2
    }

    /// Probes with fresh keys until the decisions are Redis' and correct, within `limit`.
    pub async fn until_correct(&mut self, limit: Duration, when: &str) -> Duration {
        let start = Instant::now();
        for attempt in 0.. {
            if self.correct_now(&format!("{when}-{attempt}")).await {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "{}: decisions not correct {when} after {limit:?}:\n{}",
                self.name,
                self.server.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        unreachable!()
    }

    /// Stops `load` once Redis decides again after `healed`, then holds the service to the
    /// contract and prints the scenario's figures. `data_losses`: how many times the fault can
    /// have thrown away what Redis held (each may hand one budget back).
    pub async fn finish(
        &mut self,
        load: Load,
        fault: Instant,
        healed: Instant,
        data_losses: u64,
        hot: &[String],
    ) -> Report {
        let until = Instant::now() + Duration::from_secs(30);
        while !load.redis_decided_since(healed + Duration::from_millis(200)) {
            assert!(
                Instant::now() < until,
                "{}: Redis never decided again after the fault healed:\n{}",
                self.name,
                self.server.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A second of steady load after recovery.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let samples = load.stop().await;

        let worst = samples.iter().map(|s| s.took).max().unwrap_or_default();
        let failures: Vec<&Sample> = samples
            .iter()
            .filter(|s| matches!(s.answer, Answer::FailureMode))
            .collect();
        let last_failure = failures.iter().map(|s| s.started + s.took).max();
        let mut per_key: HashMap<usize, (u64, u64)> = HashMap::new();
        for s in &samples {
            if let Some(i) = s.hot {
                let entry = per_key.entry(i).or_default();
                if matches!(s.answer, Answer::Redis { admitted: true }) {
                    entry.0 += 1;
                }
                if matches!(s.answer, Answer::FailureMode) {
                    entry.1 += 1;
                }
            }
        }
        let report = Report {
            calls: samples.len(),
            failure_answers: failures.len(),
            worst,
            outage: last_failure.map_or(Duration::ZERO, |t| t.saturating_duration_since(fault)),
            recovery: last_failure.map_or(Duration::ZERO, |t| t.saturating_duration_since(healed)),
            most_admitted: per_key.values().map(|(a, _)| *a).max().unwrap_or(0),
            admitted: per_key.values().map(|(a, _)| *a).sum(),
            keys_used: per_key.len(),
        };

        assert!(
            worst <= DEADLINE + SLACK,
            "{}: a call took {worst:?}, past the deadline {DEADLINE:?}",
            self.name
        );
        let allowed = BUDGET * (1 + data_losses);
        for (i, (admitted, failed)) in &per_key {
            assert!(
                *admitted <= allowed,
                "{}: {} admitted {admitted} with a budget of {BUDGET} (allowed {allowed})",
                self.name,
                hot[*i]
            );
            // Untouched by the fault and offered its whole phase: Redis admits exactly the budget.
            let offered = samples.iter().filter(|s| s.hot == Some(*i)).count() as u64;
            if data_losses == 0 && *failed == 0 && offered > 2 * BUDGET && *i + 1 < per_key.len() {
                assert_eq!(*admitted, BUDGET, "{}: {} exact", self.name, hot[*i]);
            }
        }
        let correct_after = self.until_correct(Duration::from_secs(10), "after").await;

        // Nothing left behind: tasks, descriptors and Redis connections back where they were.
        let base = self.baseline;
        let until = Instant::now() + Duration::from_secs(10);
        let settled = loop {
            let now = self.resources().await;
            if now.tasks <= base.tasks + 4.0
                && now.fds <= base.fds + 4.0
                && now.redis_clients <= self.redis_client_bound
            {
                break now;
            }
            assert!(
                Instant::now() < until,
                "{}: resources did not settle: before {base:?}, after {now:?}; clients: {:?}",
                self.name,
                self.redis_ports
                    .iter()
                    .map(|p| (p, cli(*p, &["CLIENT", "LIST"])))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            !self.server.log().contains("panicked"),
            "{}: a panic:\n{}",
            self.name,
            self.server.log()
        );
        println!(
            "FAULT {} | calls {} | failure-mode answers {} | worst call {} ms | outage {:.2} s | \
             recovery after heal {:.2} s | correct again {:.2} s later | admitted {} of {} (most for one key {} of {}) | \
             tasks {}→{} fds {}→{} redis connections {}→{}",
            self.name,
            report.calls,
            report.failure_answers,
            report.worst.as_millis(),
            report.outage.as_secs_f64(),
            report.recovery.as_secs_f64(),
            correct_after.as_secs_f64(),
            report.admitted,
            BUDGET * report.keys_used as u64,
            report.most_admitted,
            BUDGET,
            base.tasks,
            settled.tasks,
            base.fds,
            settled.fds,
            base.redis_clients,
            settled.redis_clients,
        );
        report
    }
}
