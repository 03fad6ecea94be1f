//! The processes the load benchmark measures: the service (or the null server) on loopback
//! ports, and what is read from it and from Redis (metrics, script statistics, process ids).
//! Every process started here is stopped when its handle drops.

use super::*;

/// The service or the null server, as a child process on loopback ports.
pub struct Server {
    pub child: Child,
    pub grpc: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub log: PathBuf,
}

impl Server {
    pub fn wait_listening(&mut self) {
        let start = Instant::now();
        while TcpStream::connect(self.grpc).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "server exited ({status}): {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "server not listening"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The arguments that make `binary` write new counters as strings (`--redis-layout packed`),
    /// as far as it can: an older build knows only the sliding window's
    /// (`--redis-sliding-layout packed`), the oldest none (its only layout). Read from its help.
    pub fn packed_layout_args(binary: &Path) -> Vec<String> {
        let help = Command::new(binary)
            .args(["serve", "--help"])
            .output()
            .expect("portcullis serve --help");
        let help = String::from_utf8_lossy(&help.stdout);
        ["--redis-layout", "--redis-sliding-layout"]
            .into_iter()
            .find(|flag| help.contains(&format!("{flag} ")))
            .map_or(Vec::new(), |flag| {
                vec![flag.to_owned(), "packed".to_owned()]
            })
    }

    pub fn portcullis(binary: &Path, dir: &Path, store_args: &[String]) -> Server {
        let (grpc, admin) = (free_port(), free_port());
        let log = dir.join(format!("portcullis-{grpc}.log"));
        let child = Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(dir.join("rules"))
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            // A decision late under saturation is still a decision: the failure mode must not
            // answer in the benchmark (it is checked to have answered nothing).
            .args(["--store-timeout", "2s", "--log-level", "warn"])
            .args(store_args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start portcullis");
        let mut server = Server {
            child,
            grpc: ([127, 0, 0, 1], grpc).into(),
            admin: Some(([127, 0, 0, 1], admin).into()),
            log,
        };
        server.wait_listening();
        server
    }

    pub fn null(dir: &Path) -> Server {
        let grpc = free_port();
        let log = dir.join("null.log");
        let child = Command::new(std::env::current_exe().expect("own path"))
            .args(["--null-server", &grpc.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start the null server");
        let mut server = Server {
            child,
            grpc: ([127, 0, 0, 1], grpc).into(),
            admin: None,
            log,
        };
        server.wait_listening();
        server
    }

    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("admin listener");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// Sums the samples of `name` (any labels) whose label text contains `with`.
pub fn metric(text: &str, name: &str, with: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(with))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// (calls, usec) of script commands (FCALL, EVALSHA and EVAL) on the nodes at `ports`.
pub fn script_stats(ports: &[u16]) -> (f64, f64) {
    let mut calls = 0.0;
    let mut usec = 0.0;
    for port in ports {
        for line in cli(*port, &["INFO", "commandstats"]).lines() {
            if !["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|c| line.starts_with(c))
            {
                continue;
            }
            for field in line.split_once(':').map_or("", |(_, f)| f).split(',') {
                match field.split_once('=') {
                    Some(("calls", v)) => calls += v.parse::<f64>().unwrap_or(0.0),
                    Some(("usec", v)) => usec += v.parse::<f64>().unwrap_or(0.0),
                    _ => {}
                }
            }
        }
    }
    (calls, usec)
}

pub fn redis_pid(port: u16) -> u32 {
    cli(port, &["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("redis process_id")
}
