//! `foldgate key-id`: an operator's way from raw API keys to the `key_id`s a policy names
//! (D2), the same ids the gateway derives, and never the keys themselves in its output.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use gateway_node::http::auth::{KeyHasher, KeyIdText};

/// `foldgate key-id` under the hash key `hex`, fed `input` on standard input.
fn key_id(hex: &str, input: &str) -> Output {
    let file = std::env::temp_dir().join(format!(
        "foldgate-key-id-{}-{}.hex",
        std::process::id(),
        input.len()
    ));
    std::fs::write(&file, hex).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_foldgate"))
        .args(["key-id", "--hash-key-file"])
        .arg(&file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    std::fs::remove_file(&file).ok();
    out
}

#[test]
fn key_id_prints_the_gateways_ids_and_never_a_key() {
    let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let keys = ["fgk_first_key_0001", "fgk_second_key_0002"];
    // Trimmed as the gateway trims a header's key.
    let out = key_id(hex, &format!("{} \r\n\n\t{}\n", keys[0], keys[1]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let hasher = KeyHasher::from_hex(1, hex).unwrap();
    let expected: Vec<String> = keys
        .iter()
        .map(|k| KeyIdText(hasher.key_id(k.as_bytes())).to_string())
        .collect();
    assert_eq!(text.lines().collect::<Vec<_>>(), expected);
    for k in keys {
        assert!(!text.contains(k), "a raw key in the output: {text}");
    }
}

/// A line the gateway would refuse as malformed gets no id (it would be a dead policy
/// entry); the error names the line, never its text.
#[test]
fn key_id_refuses_a_key_the_gateway_would_refuse() {
    let out = key_id(&"ab".repeat(32), "fgk_fine_key_0001\nshort7\n");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2"), "{err}");
    assert!(!err.contains("short7"), "{err}");
}
