//! `portcullis serve` as a separate process (for what only a process shows: signals, a faked host
//! clock, environment variables), on free loopback ports, killed when dropped unless it exited.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::redis::{free_port, wait_until};

pub struct ServeProcess {
    pub child: Child,
    pub grpc_port: u16,
    pub admin_port: u16,
    /// Its standard error: the log.
    log: tempfile::NamedTempFile,
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
        let (grpc_port, admin_port) = (free_port(), free_port());
        let log = tempfile::NamedTempFile::new().expect("log file");
        let bin = env!("CARGO_BIN_EXE_portcullis");
        let mut cmd = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut c = Command::new(program);
                c.args(wrapper_args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
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
        };
        wait_until("portcullis to listen", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
        });
        process
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
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
