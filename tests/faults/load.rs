//! The paced load every scenario runs: workers calling over rotating hot keys and fresh keys,
//! each answer's code and latency kept as a sample.

use super::*;

pub struct Sample {
    pub started: Instant,
    pub took: Duration,
    /// Index into the hot keys, or None for a fresh key.
    pub hot: Option<usize>,
    pub answer: Answer,
}

/// Paced load from `WORKERS` tasks on one HTTP/2 connection, until stopped.
pub struct Load {
    pub stop: Arc<AtomicBool>,
    pub samples: Arc<Mutex<Vec<Sample>>>,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    pub started: Instant,
}

impl Load {
    pub fn start(
        client: &RateLimitServiceClient<Channel>,
        hot: &[String],
        fresh: &[String],
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let hot: Arc<Vec<String>> = Arc::new(hot.to_vec());
        let fresh: Arc<Vec<String>> = Arc::new(fresh.to_vec());
        let tasks = (0..WORKERS)
            .map(|worker| {
                let (stop, samples) = (stop.clone(), samples.clone());
                let (hot, fresh) = (hot.clone(), fresh.clone());
                let mut client = client.clone();
                tokio::spawn(async move {
                    // Bounded: a scenario never runs for two minutes.
                    for n in 0..(120_000 / PACE.as_millis() as usize) {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let phase = (started.elapsed().as_millis() / PHASE.as_millis()) as usize;
                        let hot_index = (n % 2 == 0).then(|| phase.min(hot.len() - 1));
                        let req = match hot_index {
                            Some(i) => request("faults", &[&[("hot", &hot[i])]]),
                            None => {
                                let value = &fresh[(n * WORKERS + worker) % fresh.len()];
                                request("faults", &[&[("fresh", value)]])
                            }
                        };
                        let call_started = Instant::now();
                        let mut call = tonic::Request::new(req);
                        call.set_timeout(Duration::from_secs(5));
                        let status = client.should_rate_limit(call).await;
                        let took = call_started.elapsed();
                        let r = status.expect("every call is answered").into_inner();
                        let reset = r.statuses[0]
                            .duration_until_reset
                            .as_ref()
                            .map_or(0, |d| d.seconds);
                        // The failure mode's refusal says "retry in 1 s"; an hourly rule's says far more.
                        let answer = if r.overall_code == OVER && reset <= 1 {
                            Answer::FailureMode
                        } else {
                            Answer::Redis {
                                admitted: r.overall_code == OK,
                            }
                        };
                        samples.lock().unwrap().push(Sample {
                            started: call_started,
                            took,
                            hot: hot_index,
                            answer,
                        });
                        tokio::time::sleep(PACE).await;
                    }
                })
            })
            .collect();
        Load {
            stop,
            samples,
            tasks,
            started,
        }
    }

    /// Whether a fresh key was decided by Redis in a call that started after `since`.
    pub fn redis_decided_since(&self, since: Instant) -> bool {
        self.samples.lock().unwrap().iter().any(|s| {
            s.hot.is_none()
                && s.started > since
                && matches!(s.answer, Answer::Redis { admitted: true })
        })
    }

    pub async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.expect("load task");
        }
        let _ = self.started;
        Arc::try_unwrap(self.samples)
            .ok()
            .expect("no other owner")
            .into_inner()
            .unwrap()
    }
}
