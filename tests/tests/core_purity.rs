//! The protocol cores have no IO: `node-core`, `fold-core` and `credit-sizing` are state
//! machines and arithmetic that are handed the time and messages, so the simulator, the
//! embedded bus and the NATS runtime can all drive the same code, deterministically.
//!
//! Two guards, because either alone can be got round: their dependency trees (as `cargo
//! tree` resolves them, normal and build dependencies) hold no async runtime, network,
//! HTTP, Kafka or clock crate; and their sources, outside unit tests, name no clock,
//! socket, file or thread.

use std::path::{Path, PathBuf};
use std::process::Command;

const CORES: [&str; 3] = ["node-core", "fold-core", "credit-sizing"];

/// Crates that reach a runtime, a socket or a clock. A core that needs one of these has
/// let IO in: the fix is to hand the core what it needs as an argument.
const FORBIDDEN: [&str; 16] = [
    "tokio",
    "mio",
    "socket2",
    "async-nats",
    "hyper",
    "hyper-util",
    "h2",
    "reqwest",
    "rdkafka",
    "rdkafka-sys",
    "rustls",
    "tokio-rustls",
    "chrono",
    "time",
    "quanta",
    "coarsetime",
];

/// What a core's source must not name: the clocks, sockets, files and threads of std.
const FORBIDDEN_IN_SOURCE: [&str; 7] = [
    "Instant::now",
    "SystemTime",
    "std::net",
    "std::fs",
    "std::thread",
    "tokio::",
    "std::process",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

/// Every package in `package`'s normal and build dependency tree, by name.
fn dependency_tree(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace_root())
        .args(["tree", "--offline", "--locked", "-p", package])
        .args(["-e", "normal,build", "--prefix", "none", "--format", "{p}"])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

fn forbidden_in(tree: &[String]) -> Vec<&'static str> {
    FORBIDDEN
        .iter()
        .copied()
        .filter(|f| tree.iter().any(|p| p == f))
        .collect()
}

#[test]
fn the_cores_dependency_trees_hold_no_runtime_socket_or_clock_crate() {
    for core in CORES {
        let tree = dependency_tree(core);
        assert!(
            tree.iter().any(|p| p == core),
            "cargo tree -p {core} did not list {core} itself: {tree:?}"
        );
        let found = forbidden_in(&tree);
        assert!(found.is_empty(), "{core} depends on {found:?}");
    }
}

/// The guard itself can fail: the gateway's runtime crate, which does IO, is caught.
#[test]
fn the_guard_catches_a_crate_that_does_io() {
    let found = forbidden_in(&dependency_tree("gateway-node"));
    assert!(
        found.contains(&"tokio") && found.contains(&"async-nats"),
        "{found:?}"
    );
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_cores_sources_name_no_clock_socket_file_or_thread() {
    let root = workspace_root();
    let dirs = [
        "gateway-node/core/src",
        "fold-workers/core/src",
        "fold-workers/sizing/src",
    ];
    for dir in dirs {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        assert!(!files.is_empty(), "no sources under {dir}");
        for file in files {
            let text = std::fs::read_to_string(&file).expect("readable source");
            // Unit tests may use threads to race the code under test: a file's test module,
            // at its end by convention, is not the core.
            let core = text.split("#[cfg(test)]").next().unwrap_or("");
            for (n, line) in core.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for name in FORBIDDEN_IN_SOURCE {
                    assert!(
                        !code.contains(name),
                        "{}:{}: names {name}",
                        file.display(),
                        n + 1
                    );
                }
            }
        }
    }
}
