//! A real Kafka-protocol broker for the limit-event tests (issue 27): tansu, found on
//! `PATH` (`scripts/test.sh` installs it with `cargo install` into a cache outside the clone
//! when it is missing), started on a free loopback port with in-memory storage, and killed
//! when dropped. Clients are the real librdkafka (rdkafka's bundled build); nothing here
//! imitates Kafka.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The broker version `scripts/test.sh` installs; checked here with librdkafka 2.12+
/// (stack-facts 7: Debian's librdkafka 2.0 fails its handshake with it).
pub const TANSU_VERSION: &str = "0.6.0";

pub struct KafkaBroker {
    child: Option<crate::KillOnDrop>,
    pub port: u16,
    log_path: PathBuf,
    paused: bool,
}

impl KafkaBroker {
    /// Starts tansu on a free 127.0.0.1 port; panics (with its log) if it is not
    /// listening within 10 s, leaving no process behind.
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let log_path =
            std::env::temp_dir().join(format!("foldgate-tansu-{}-{port}.log", std::process::id()));
        let log = std::fs::File::create(&log_path).expect("tansu log file");
        let url = format!("tcp://127.0.0.1:{port}");
        let mut child = crate::KillOnDrop(
            Command::new("tansu")
                .args([
                    "broker",
                    "--listener-url",
                    &url,
                    "--advertised-listener-url",
                    &url,
                ])
                .args(["--storage-engine", "memory://tansu/"])
                .stdout(log.try_clone().expect("tansu log file"))
                .stderr(log)
                .stdin(Stdio::null())
                .spawn()
                .expect(
                    "tansu not found on PATH: run ./scripts/test.sh, which installs it \
                     (cargo install tansu --features dynostore) when it is missing",
                ),
        );
        let up_by = Instant::now() + Duration::from_secs(10);
        loop {
            let failure = match child.0.try_wait() {
                Ok(Some(status)) => Some(format!("exited ({status})")),
                Ok(None) if TcpStream::connect(("127.0.0.1", port)).is_ok() => break,
                Ok(None) if Instant::now() >= up_by => Some("not listening after 10 s".into()),
                Ok(None) => None,
                Err(e) => Some(format!("could not be waited on: {e}")),
            };
            if let Some(failure) = failure {
                drop(child);
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("tansu on 127.0.0.1:{port} {failure}; its log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child: Some(child),
            port,
            log_path,
            paused: false,
        }
    }

    /// `bootstrap.servers` for a client.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kafka is gone for clients (a drill) but keeps what it stored: the process is
    /// stopped (SIGSTOP), so connections hang and time out as on a dead broker, and
    /// `resume` brings back the same topics. Storage is in memory, so a real kill would
    /// lose them.
    pub fn pause(&mut self) {
        self.signal("-STOP");
        self.paused = true;
    }

    pub fn resume(&mut self) {
        self.signal("-CONT");
        self.paused = false;
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("broker running").0.id();
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {pid} failed");
    }

    /// The broker's log so far, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        if self.paused {
            // A stopped process ignores nothing but SIGKILL; resume first so the kill
            // and reap in the guard do not race a frozen child.
            self.resume();
        }
        drop(self.child.take());
        let _ = std::fs::remove_file(&self.log_path);
    }
}
