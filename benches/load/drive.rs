//! The tonic generator: drives calls over a few channels, checks every answer, counts.
//! It must never count a wrong answer as a decision.

use super::*;

#[derive(Default)]
pub struct Tally {
    pub calls: u64,
    pub wrong: u64,
    pub errors: u64,
    pub first_problem: Option<String>,
    pub latencies_us: Vec<u32>,
    /// When each admitted call was answered (µs since the epoch, the host clock Redis shares
    /// here): rows at their limit only.
    pub admitted_at_us: Vec<u64>,
}

impl Tally {
    pub fn merge(&mut self, other: Tally) {
        self.calls += other.calls;
        self.wrong += other.wrong;
        self.errors += other.errors;
        if self.first_problem.is_none() {
            self.first_problem = other.first_problem;
        }
        self.latencies_us.extend(other.latencies_us);
        self.admitted_at_us.extend(other.admitted_at_us);
    }

    /// Admitted per whole second of the run (the partial first and last left out), sorted.
    pub fn admitted_per_second(&self) -> Vec<u64> {
        let mut per: std::collections::BTreeMap<u64, u64> = Default::default();
        for t in &self.admitted_at_us {
            *per.entry(t / 1_000_000).or_default() += 1;
        }
        let (Some(first), Some(last)) =
            (per.keys().next().copied(), per.keys().next_back().copied())
        else {
            return Vec::new();
        };
        let mut whole: Vec<u64> = (first + 1..last)
            .map(|s| per.get(&s).copied().unwrap_or(0))
            .collect();
        whole.sort_unstable();
        whole
    }

    pub fn percentile(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let at = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_us[at] as f64 / 1000.0
    }
}

/// Drives `scenario` for `duration` over `channels`, `streams` calls in flight on each; with
/// `rate`, paced to that many calls per second in total (each loop sends on its own schedule).
pub async fn drive(
    channels: &[Channel],
    streams: usize,
    scenario: Scenario,
    duration: Duration,
    rate: Option<f64>,
) -> (Tally, Duration) {
    let counter = Arc::new(AtomicU64::new(0));
    let loops = channels.len() * streams;
    let start = tokio::time::Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = (0..loops)
        .map(|n| {
            let mut client = RateLimitServiceClient::new(channels[n % channels.len()].clone());
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut own = 0u64;
                let period = rate.map(|r| Duration::from_secs_f64(loops as f64 / r));
                // Spread the paced loops over one period so they do not fire together.
                let mut next =
                    start + period.map_or(Duration::ZERO, |p| p * n as u32 / loops as u32);
                loop {
                    if period.is_some() {
                        tokio::time::sleep_until(next).await;
                    }
                    // Latency counts from the actual send: tokio's timer fires up to a
                    // millisecond late, which is the generator's delay, not the service's. A
                    // generator that falls behind shows as a rate below the one asked for.
                    let sent = tokio::time::Instant::now();
                    if sent >= end || (period.is_some() && next >= end) {
                        break;
                    }
                    let i = if scenario == Scenario::Concurrency {
                        // A hold, then its release on the same loop (as a request's stream end
                        // follows its start); the pairs of the loops spread over the values.
                        let pair = own / 2 * loops as u64 + n as u64;
                        own += 1;
                        pair * 2 + (own - 1) % 2
                    } else {
                        counter.fetch_add(1, Ordering::Relaxed)
                    };
                    let answer = client.should_rate_limit(scenario.request(i)).await;
                    tally
                        .latencies_us
                        .push(sent.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    tally.calls += 1;
                    match answer {
                        Ok(answer) => {
                            let answer = answer.into_inner();
                            if matches!(scenario, Scenario::AtLimit(..))
                                && answer.overall_code == Code::Ok as i32
                            {
                                tally.admitted_at_us.push(wall_us());
                            }
                            if let Err(problem) = scenario.verify(&answer) {
                                tally.wrong += 1;
                                tally.first_problem.get_or_insert(problem);
                            }
                        }
                        Err(status) => {
                            tally.errors += 1;
                            tally.first_problem.get_or_insert(status.to_string());
                        }
                    }
                    if let Some(period) = period {
                        next += period;
                    }
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.expect("generator task"));
    }
    tally.latencies_us.sort_unstable();
    (tally, start.elapsed())
}

/// Microseconds since the epoch on the host clock.
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

pub async fn connect(addr: SocketAddr, connections: usize) -> Vec<Channel> {
    let mut channels = Vec::new();
    for _ in 0..connections {
        // One endpoint each: separate HTTP/2 connections, as several Envoy workers make.
        channels.push(
            Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .tcp_nodelay(true)
                .connect()
                .await
                .expect("connect"),
        );
    }
    channels
}
