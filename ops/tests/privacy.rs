//! Subject access, erasure and the keyring through the `foldgate` binary (E5, P3, ADR-7):
//! a subject with events under two hash versions, raw and rolled up; afterwards no row
//! of theirs under any version, every other row untouched, the audit record present and
//! verifying, a tampered trail failing, and no raw key in any file or output of the run.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use arrow::array::{Array, StringArray};
use bus_schemas::{EventId, KeyId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};
use foldgate_archive::compact::{days_in, parquet_files};
use foldgate_archive::sink::{node_file_name, write_events};
use foldgate_archive::{ArchiveLayout, SinkConfig};

const DAY_MS: u64 = 86_400_000;
/// 2025-12-03: past a 30-day retention, so it is rolled up.
const OLD_DAY_MS: u64 = 1_764_720_000_000;

struct Run {
    dir: tempfile::TempDir,
    /// Every byte the commands printed, for the raw-key scan.
    printed: Vec<u8>,
}

impl Run {
    fn archive(&self) -> PathBuf {
        self.dir.path().join("archive")
    }
    fn keyring(&self) -> PathBuf {
        self.dir.path().join("secrets").join("keyring.toml")
    }
    fn keys_file(&self) -> PathBuf {
        self.dir.path().join("input").join("subject-keys.txt")
    }

    fn foldgate(&mut self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_foldgate"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        self.printed.extend(&out.stdout);
        self.printed.extend(&out.stderr);
        out
    }

    /// `foldgate subject-access` of the keys in `keys_from` (`-`: `stdin`) into `out`.
    fn subject_access(&mut self, keys_from: &str, out: &Path, extra: &[&str], stdin: Option<&str>) {
        let (archive, keyring) = (self.archive(), self.keyring());
        let mut args = vec![
            "subject-access",
            "--archive",
            s(&archive),
            "--keyring",
            s(&keyring),
            "--keys-from",
            keys_from,
            "--out",
            s(out),
        ];
        args.extend(extra);
        self.ok(&args, stdin);
    }

    fn ok(&mut self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.foldgate(args, stdin);
        assert!(
            out.status.success(),
            "foldgate {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn event(key: KeyId, node: u32, seq: u64, at_ms: u64) -> LimitEvent {
    LimitEvent {
        id: EventId {
            node: NodeId(node),
            node_epoch: NodeEpoch(11),
            seq,
        },
        key,
        plan_id: 1,
        window: WindowId {
            length_ms: 1_000,
            number: at_ms / 1_000,
        },
        at_ms,
        correlation_id: format!("c{node}-{seq}"),
        reason: if seq.is_multiple_of(5) {
            LimitReason::FastPathDeadline
        } else {
            LimitReason::Exhausted
        },
        degraded: false,
        retry_after_ms: 500,
    }
}

/// Rows per archive-relative file, and how many of them are `subject`'s key ids.
fn census(root: &Path, subject: &BTreeSet<String>) -> BTreeMap<String, (usize, usize)> {
    let layout = ArchiveLayout::new(root);
    let mut out = BTreeMap::new();
    for table in [layout.events_dir(), layout.rollup_dir()] {
        for day in days_in(&table) {
            for f in parquet_files(&ArchiveLayout::day_dir(&table, day)) {
                let mut rows = (0, 0);
                for b in foldgate_archive::reader::read_file(&f).unwrap() {
                    let ids = b
                        .column_by_name("key_id")
                        .unwrap()
                        .as_any()
                        .downcast_ref::<StringArray>()
                        .unwrap()
                        .clone();
                    rows.0 += ids.len();
                    rows.1 += (0..ids.len())
                        .filter(|&i| subject.contains(ids.value(i)))
                        .count();
                }
                out.insert(foldgate_archive::compact::relative(root, &f), rows);
            }
        }
    }
    out
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn erasure_removes_a_subject_under_every_hash_version_and_nothing_else() {
    let mut run = Run {
        dir: tempfile::tempdir().unwrap(),
        printed: Vec::new(),
    };
    let (archive, keyring) = (run.archive(), run.keyring());
    for reason in ["first key", "rotation"] {
        run.ok(
            &[
                "hash-key",
                "add",
                "--keyring",
                s(&keyring),
                "--archive",
                s(&archive),
                "--principal",
                "alice",
                "--reason",
                reason,
            ],
            None,
        );
    }
    let list = run.ok(&["hash-key", "list", "--keyring", s(&keyring)], None);
    assert!(
        list.contains("1 ") && list.contains("2 ") && list.contains("retained"),
        "{list}"
    );
    let ring = ops::keyring::Keyring::load(&keyring).unwrap();
    for k in &ring.keys {
        assert!(
            !list.contains(k.secret_hex.as_deref().unwrap()),
            "list shows no key bytes"
        );
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&keyring).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let hashers = ring.hashers().unwrap();
    assert_eq!(hashers.len(), 2);

    // The subject and four others, each with events under both versions on an old day
    // (rolled up), a closed recent day (compacted) and today (raw, another writer's).
    let raw_keys: Vec<String> = (0..5).map(|i| ops::keys::bench_key(77, i)).collect();
    let today_ms = chrono::Utc::now().timestamp_millis() as u64 / DAY_MS * DAY_MS;
    let mut events = Vec::new();
    let mut seq = 0;
    for day_ms in [OLD_DAY_MS, today_ms - 2 * DAY_MS, today_ms] {
        for raw in &raw_keys {
            for h in &hashers {
                for i in 0..6 {
                    seq += 1;
                    events.push(event(
                        h.key_id(raw.as_bytes()),
                        1,
                        seq,
                        day_ms + 1_000 + i * 60_000,
                    ));
                }
            }
        }
    }
    let config = SinkConfig {
        layout: ArchiveLayout::new(&archive),
        file_events_max: 16,
    };
    write_events(&config, &events, node_file_name).unwrap();
    run.ok(&["archive", "retain", "--archive", s(&archive)], None);
    run.ok(&["archive", "compact", "--archive", s(&archive)], None);

    let subject: BTreeSet<String> = hashers
        .iter()
        .map(|h| h.key_id(raw_keys[0].as_bytes()).text())
        .collect();
    let before = census(&archive, &subject);
    assert!(
        before.keys().any(|f| f.starts_with("rollup/")),
        "{before:?}"
    );
    assert!(
        before.keys().any(|f| f.contains("compacted-g")),
        "{before:?}"
    );
    let subject_raw: usize = before
        .iter()
        .filter(|(f, _)| f.starts_with("events/"))
        .map(|(_, r)| r.1)
        .sum();
    let subject_rollup: usize = before
        .iter()
        .filter(|(f, _)| f.starts_with("rollup/"))
        .map(|(_, r)| r.1)
        .sum();
    assert_eq!(subject_raw, 2 * 2 * 6, "two raw days, two versions");
    assert!(subject_rollup >= 2, "one roll-up row per version at least");

    fs::create_dir_all(run.keys_file().parent().unwrap()).unwrap();
    fs::write(run.keys_file(), format!("{}\n", raw_keys[0])).unwrap();
    let keys_file = run.keys_file();

    // Subject access: both versions, raw and roll-up, from a file and from stdin.
    let export = run.dir.path().join("out").join("subject.csv");
    fs::create_dir_all(export.parent().unwrap()).unwrap();
    run.subject_access(s(&keys_file), &export, &["--format", "csv"], None);
    let csv = fs::read_to_string(&export).unwrap();
    assert_eq!(
        csv.lines().filter(|l| l.starts_with("events,")).count(),
        subject_raw
    );
    assert_eq!(
        csv.lines().filter(|l| l.starts_with("rollup,")).count(),
        subject_rollup
    );
    assert_eq!(
        fs::metadata(&export).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let export_json = run.dir.path().join("out").join("subject.json");
    run.subject_access("-", &export_json, &[], Some(&format!("{}\n", raw_keys[0])));
    let json = fs::read_to_string(&export_json).unwrap();
    assert_eq!(json.lines().count(), subject_raw + subject_rollup);
    // `foldgate history --keys-from` with the keyring: every retained version.
    let history = run.ok(
        &[
            "history",
            "--archive",
            s(&archive),
            "--keyring",
            s(&keyring),
            "--keys-from",
            "-",
            "--format",
            "csv",
        ],
        Some(&format!("{}\n", raw_keys[0])),
    );
    assert_eq!(history.lines().count(), 1 + subject_raw, "{history}");

    // A version with events under it cannot be destroyed.
    let refused = run.foldgate(
        &[
            "hash-key",
            "destroy",
            "1",
            "--keyring",
            s(&keyring),
            "--archive",
            s(&archive),
            "--principal",
            "alice",
            "--reason",
            "retire v1",
        ],
        None,
    );
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("refused"));
    assert_eq!(
        ops::keyring::Keyring::load(&keyring)
            .unwrap()
            .hashers()
            .unwrap()
            .len(),
        2
    );

    let erased = run.ok(
        &[
            "erase",
            "--archive",
            s(&archive),
            "--keyring",
            s(&keyring),
            "--keys-from",
            s(&keys_file),
            "--principal",
            "dpo@example.com",
            "--reason",
            "GDPR art. 17 request 2026-118",
        ],
        None,
    );
    assert!(erased.contains("erased"), "{erased}");

    // No row of the subject under any version; every other row where it was.
    let after = census(&archive, &subject);
    assert!(after.values().all(|r| r.1 == 0), "{after:?}");
    for (file, (rows, theirs)) in &before {
        match after.get(file) {
            Some((left, 0)) => assert_eq!(*left, rows - theirs, "{file}"),
            Some(other) => panic!("{file}: {other:?}"),
            None => assert_eq!(rows, theirs, "{file} went though it held others' rows"),
        }
    }
    assert_eq!(
        after.len() + before.values().filter(|r| r.0 == r.1).count(),
        before.len()
    );

    // The audit record: who, why, which versions, rows per file; no key id in clear.
    let trail = fs::read_to_string(archive.join("audit").join("records.jsonl")).unwrap();
    let last = trail.lines().last().unwrap();
    assert!(
        last.contains("\"action\":\"erase\"") && last.contains("dpo@example.com"),
        "{last}"
    );
    assert!(
        last.contains("GDPR art. 17") && last.contains("\"hash_versions\":[1,2]"),
        "{last}"
    );
    assert!(
        last.contains(&format!(
            "\"rows_removed\":{}",
            subject_raw + subject_rollup
        )),
        "{last}"
    );
    for id in &subject {
        assert!(
            !trail.contains(id.as_str()) && !trail.contains(&id[3..]),
            "key id in the trail"
        );
    }
    let verify = run.ok(&["audit", "verify", "--archive", s(&archive)], None);
    assert!(
        verify.contains("3 records"),
        "two adds and the erasure: {verify}"
    );
    let erased_set =
        foldgate_archive::erasure::ErasedKeys::load(&ArchiveLayout::new(&archive)).unwrap();
    assert!(subject.iter().all(|id| erased_set.contains(id)));
    assert!(!erased_set.contains(&hashers[0].key_id(raw_keys[1].as_bytes()).text()));
    // After an erasure, subject access finds nothing.
    run.subject_access(s(&keys_file), &export_json, &[], None);
    assert_eq!(fs::read_to_string(&export_json).unwrap().lines().count(), 0);

    // A raw-key scan of everything the run wrote or printed, but its own input file.
    let mut scanned = 0;
    for f in files_under(run.dir.path()) {
        if f == keys_file {
            continue;
        }
        let bytes = fs::read(&f).unwrap();
        for raw in &raw_keys {
            assert!(
                !contains(&bytes, raw.as_bytes()),
                "raw key in {}",
                f.display()
            );
        }
        scanned += 1;
    }
    assert!(scanned >= 8, "{scanned} files scanned");
    for raw in &raw_keys {
        assert!(
            !contains(&run.printed, raw.as_bytes()),
            "raw key in the commands' output"
        );
    }

    // One byte of an earlier record edited: `audit verify` fails and names it.
    let path = archive.join("audit").join("records.jsonl");
    let good = fs::read(&path).unwrap();
    let mut bad = good.clone();
    let at = trail.find("first key").unwrap();
    bad[at] = b'F';
    fs::write(&path, &bad).unwrap();
    let failed = run.foldgate(&["audit", "verify", "--archive", s(&archive)], None);
    assert!(!failed.status.success());
    let why = String::from_utf8_lossy(&failed.stderr);
    assert!(why.contains("record 1 "), "{why}");
    fs::write(&path, &good).unwrap();
    run.ok(&["audit", "verify", "--archive", s(&archive)], None);
}

#[test]
fn a_keyring_inside_the_archive_or_readable_by_others_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let inside = archive.join("keyring.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_foldgate"))
        .args([
            "hash-key",
            "add",
            "--keyring",
            s(&inside),
            "--archive",
            s(&archive),
        ])
        .args(["--principal", "p", "--reason", "r"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("inside the archive"));
    let ring = dir.path().join("keyring.toml");
    let add = Command::new(env!("CARGO_BIN_EXE_foldgate"))
        .args([
            "hash-key",
            "add",
            "--keyring",
            s(&ring),
            "--archive",
            s(&archive),
        ])
        .args(["--principal", "p", "--reason", "r"])
        .output()
        .unwrap();
    assert!(add.status.success());
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&ring, fs::Permissions::from_mode(0o644)).unwrap();
    let list = Command::new(env!("CARGO_BIN_EXE_foldgate"))
        .args(["hash-key", "list", "--keyring", s(&ring)])
        .output()
        .unwrap();
    assert!(!list.status.success());
    assert!(String::from_utf8_lossy(&list.stderr).contains("chmod 600"));
}

#[test]
fn a_version_without_events_is_destroyed_and_the_destruction_audited() {
    let mut run = Run {
        dir: tempfile::tempdir().unwrap(),
        printed: Vec::new(),
    };
    let (archive, keyring) = (run.archive(), run.keyring());
    let who = ["--principal", "alice", "--reason", "test"];
    for _ in 0..2 {
        let mut args = vec![
            "hash-key",
            "add",
            "--keyring",
            s(&keyring),
            "--archive",
            s(&archive),
        ];
        args.extend(who);
        run.ok(&args, None);
    }
    // Events under version 2 only: version 1 may go, version 2 may not.
    let hashers = ops::keyring::Keyring::load(&keyring)
        .unwrap()
        .hashers()
        .unwrap();
    let key = hashers[0].key_id(ops::keys::bench_key(5, 0).as_bytes());
    assert_eq!(key.version, 2);
    let config = SinkConfig {
        layout: ArchiveLayout::new(&archive),
        file_events_max: 16,
    };
    write_events(&config, &[event(key, 1, 1, OLD_DAY_MS)], node_file_name).unwrap();
    for (version, ok) in [("2", false), ("1", true)] {
        let mut args = vec![
            "hash-key",
            "destroy",
            version,
            "--keyring",
            s(&keyring),
            "--archive",
            s(&archive),
        ];
        args.extend(who);
        assert_eq!(
            run.foldgate(&args, None).status.success(),
            ok,
            "destroy {version}"
        );
    }
    let list = run.ok(&["hash-key", "list", "--keyring", s(&keyring)], None);
    assert!(list.lines().nth(1).unwrap().contains("destroyed"), "{list}");
    let trail = fs::read_to_string(archive.join("audit").join("records.jsonl")).unwrap();
    assert_eq!(trail.lines().count(), 3);
    assert!(
        trail
            .lines()
            .last()
            .unwrap()
            .contains("\"action\":\"hash-key-destroy\"")
    );
    assert_eq!(
        ops::keyring::Keyring::load(&keyring)
            .unwrap()
            .retained_versions(),
        [2]
    );
}
