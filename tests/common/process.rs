//! `portcullis serve` as a separate process (for what only a process shows: signals, a faked host
//! clock, environment variables), on free loopback ports, killed when dropped unless it exited.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::redis::{free_port, wait_until};

/// libfaketime, loaded with LD_PRELOAD and driven by FAKETIME-style variables: a process
/// whose host clock is shifted or stepped (the `faketime` wrapper races on a named semaphore
/// when several start at once: "sem_open: File exists").
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A child process killed (and reaped) when dropped: a test that fails half-way stops it too.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct ServeProcess {
    pub child: Child,
    pub grpc_port: u16,
    pub admin_port: u16,
    /// Its standard error: the log.
    log: tempfile::NamedTempFile,
    /// Holds the `ratelimit` link while the process runs.
    _link: Option<tempfile::TempDir>,
}

impl ServeProcess {
    /// Starts `portcullis serve --config <config> <args>` with `envs`, run through `wrapper` (for
    /// example `faketime -f +45s`) when it is not empty, and waits until gRPC accepts connections.
    pub fn spawn(
        config: &Path,
        args: &[&str],
        envs: &[(&str, String)],
        wrapper: &[&str],
    ) -> ServeProcess {
        Self::spawn_on(config, args, envs, wrapper, free_port(), free_port())
    }

    /// `spawn` on the given ports (a replica restarted where its clients expect it).
    pub fn spawn_on(
        config: &Path,
        args: &[&str],
        envs: &[(&str, String)],
        wrapper: &[&str],
        grpc_port: u16,
        admin_port: u16,
    ) -> ServeProcess {
        let bin = env!("CARGO_BIN_EXE_portcullis");
        Self::spawn_binary(bin, config, args, envs, wrapper, grpc_port, admin_port)
    }

    /// `spawn_on` of another build's binary (a replica of an older release beside this one).
    pub fn spawn_binary(
        bin: &str,
        config: &Path,
        args: &[&str],
        envs: &[(&str, String)],
        wrapper: &[&str],
        grpc_port: u16,
        admin_port: u16,
    ) -> ServeProcess {
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut cmd = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut c = Command::new(program);
                c.args(wrapper_args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        // Its own process group: a wrapper such as faketime runs portcullis as its child, and
        // killing the group stops both.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc_port}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin_port}")])
            .args(args)
            .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("log file"));
        let process = ServeProcess {
            child: cmd.spawn().expect("start portcullis"),
            grpc_port,
            admin_port,
            log,
            _link: None,
        };
        wait_until("portcullis to listen", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
        });
        process
    }

    /// Starts the binary as envoyproxy/ratelimit's image starts it: through a link named
    /// `ratelimit`, no arguments, and only `envs` in its environment (which must hold GRPC_PORT
    /// and DEBUG_PORT); waits until gRPC accepts connections.
    pub fn spawn_as_ratelimit(envs: &[(&str, String)]) -> ServeProcess {
        Self::spawn_as_ratelimit_with_args(envs, &[])
    }

    /// `spawn_as_ratelimit` with `args` after the program, as Kubernetes appends a container's
    /// `args` to the image's entrypoint.
    pub fn spawn_as_ratelimit_with_args(envs: &[(&str, String)], args: &[&str]) -> ServeProcess {
        let port = |name: &str| -> u16 {
            envs.iter()
                .find(|(k, _)| *k == name)
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} must be given"))
        };
        let (grpc_port, admin_port) = (port("GRPC_PORT"), port("DEBUG_PORT"));
        let (link_dir, mut cmd) = Self::ratelimit_command(envs);
        cmd.args(args);
        let log = tempfile::NamedTempFile::new().expect("log file");
        cmd.stderr(log.reopen().expect("log file"));
        let mut process = ServeProcess {
            child: cmd.spawn().expect("start ratelimit"),
            grpc_port,
            admin_port,
            log,
            _link: Some(link_dir),
        };
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", grpc_port)).is_err() {
            if let Ok(Some(status)) = process.child.try_wait() {
                panic!("ratelimit exited ({status}):\n{}", process.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "ratelimit did not listen:\n{}",
                process.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        process
    }

    /// The binary behind a link named `ratelimit`, with only `envs` set (the link's directory
    /// must outlive the command).
    pub fn ratelimit_command(envs: &[(&str, String)]) -> (tempfile::TempDir, Command) {
        let link_dir = tempfile::tempdir().expect("temp dir");
        let link = link_dir.path().join("ratelimit");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_portcullis"), &link).expect("link");
        let mut cmd = Command::new(&link);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.env_clear()
            .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null());
        (link_dir, cmd)
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    pub fn grpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    pub fn admin_addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.admin_port).into()
    }

    pub fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{name} failed");
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        // The whole group, wrapper and service (see `spawn`); a group already gone is fine.
        // SAFETY: kill(2) with a negative pid signals that process group; no memory involved.
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}
