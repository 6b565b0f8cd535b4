//! One TOML file per binary, overridable by environment and by flags.
//!
//! Layers, last wins: the struct's defaults, the file, `PREFIX_KEY=value` environment
//! variables (`__` for a nested table: `FOLDGATE_NODE_POLICY__VERSION`), then
//! `--set key=value` flags (`.` for nesting). Values are TOML (`--set round_ms=25`), and a
//! value that is not valid TOML is taken as a string (`--set upstream=http://u:80`).
//!
//! A bad layer fails at start with where it came from, the key, and what was expected:
//! `node.toml:3: key `round_ms`: invalid type: string "fast", expected u32`.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// What a configuration struct must be: read from TOML, every field defaulted by the
/// struct's own `Default` (written out as the first layer), and denying unknown fields.
pub trait Settings: DeserializeOwned + Serialize + Default {}
impl<T: DeserializeOwned + Serialize + Default> Settings for T {}

/// The flags every gateway binary takes for its configuration.
#[derive(Clone, Debug, clap::Args)]
pub struct ConfigArgs {
    /// The TOML configuration file (optional: every knob has a default).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one knob, `key=value` (a TOML value; `a.b=1` for nested keys).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    pub print_config: bool,
}

impl ConfigArgs {
    pub fn load<T: Settings>(&self, env_prefix: &str) -> Result<T, ConfigError> {
        load(self.config.as_deref(), env_prefix, &self.sets)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: key `{key}`: {message}")]
    Invalid {
        /// `file:line`, `env NAME` or `--set`.
        origin: String,
        key: String,
        message: String,
    },
}

/// Loads `T` from `file` (if any), then the environment variables starting `env_prefix`,
/// then `sets` (`key=value`). `T` must default every field (`#[serde(default)]`) and
/// should deny unknown fields, so a misspelt key fails instead of being ignored.
pub fn load<T: Settings>(
    file: Option<&Path>,
    env_prefix: &str,
    sets: &[String],
) -> Result<T, ConfigError> {
    load_from(file, std::env::vars(), env_prefix, sets)
}

/// `from` over `into`, table by table; any other value replaces what was there (an array
/// whole).
fn overlay(into: &mut toml::Table, from: toml::Table) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(under)), toml::Value::Table(over)) => overlay(under, over),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

/// `load` with the environment given, so tests need not touch the process's own.
pub fn load_from<T: Settings>(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    env_prefix: &str,
    sets: &[String],
) -> Result<T, ConfigError> {
    // The struct's own defaults are the first layer, written out whole: a table the file
    // names (`[upstream]`) would otherwise be filled from the *field's* type defaults, and
    // the edge's `upstream.max_in_flight` and `connect_timeout_ms` fell back to a node's.
    let mut table = toml::Table::try_from(T::default()).map_err(|e| ConfigError::Invalid {
        origin: "defaults".into(),
        key: String::new(),
        message: e.to_string(),
    })?;
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        // Deserialize the file on its own first, so its errors point at its own lines.
        toml::from_str::<T>(&text).map_err(|e| file_error(path, &text, &e))?;
        let file_table = toml::from_str(&text).map_err(|e| file_error(path, &text, &e))?;
        overlay(&mut table, file_table);
    }
    let mut env: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(env_prefix) && k.len() > env_prefix.len())
        .collect();
    env.sort();
    for (name, value) in env {
        let key = name[env_prefix.len()..]
            .to_ascii_lowercase()
            .replace("__", ".");
        let origin = format!("env {name}");
        set_path(&mut table, &key, parse_value(&value), &origin)?;
        check::<T>(&table, &origin, &key)?;
    }
    for s in sets {
        let Some((key, value)) = s.split_once('=') else {
            return Err(ConfigError::Invalid {
                origin: "--set".into(),
                key: s.clone(),
                message: "expected key=value".into(),
            });
        };
        let key = key.trim();
        set_path(&mut table, key, parse_value(value.trim()), "--set")?;
        check::<T>(&table, "--set", key)?;
    }
    toml::Table::try_into(table).map_err(|e| ConfigError::Invalid {
        origin: "config".into(),
        key: String::new(),
        message: e.message().to_string(),
    })
}

fn check<T: DeserializeOwned>(
    table: &toml::Table,
    origin: &str,
    key: &str,
) -> Result<(), ConfigError> {
    table
        .clone()
        .try_into::<T>()
        .map(drop)
        .map_err(|e| ConfigError::Invalid {
            origin: origin.to_string(),
            key: key.to_string(),
            message: e.message().to_string(),
        })
}

fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

fn set_path(
    table: &mut toml::Table,
    key: &str,
    value: toml::Value,
    origin: &str,
) -> Result<(), ConfigError> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let mut t = table;
    for p in parts {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry.as_table_mut().ok_or_else(|| ConfigError::Invalid {
            origin: origin.to_string(),
            key: key.to_string(),
            message: format!("`{p}` is not a table"),
        })?;
    }
    t.insert(last.to_string(), value);
    Ok(())
}

fn file_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let (line, key) = match e.span() {
        Some(span) => {
            let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or_default();
            // A line with no `key =` is not echoed: it may be a secret pasted on a line
            // of its own, or `hash_key_hex: "..."`.
            let key = line
                .split_once('=')
                .map(|(k, _)| k.trim().to_string())
                .unwrap_or_else(|| "(a line with no `key =`)".to_string());
            (line_no, key)
        }
        None => (0, String::new()),
    };
    ConfigError::Invalid {
        origin: format!("{}:{line}", path.display()),
        key,
        message: e.message().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, serde::Serialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Sample {
        round_ms: u32,
        upstream: String,
        inner: Inner,
    }

    #[derive(Debug, serde::Deserialize, serde::Serialize, PartialEq, Default)]
    #[serde(default, deny_unknown_fields)]
    struct Inner {
        version: u64,
    }

    impl Default for Sample {
        fn default() -> Self {
            Self {
                round_ms: 25,
                upstream: "http://127.0.0.1:1".into(),
                inner: Inner::default(),
            }
        }
    }

    /// A table the file names keeps the struct's own defaults for what it leaves out, not
    /// the nested type's (the edge's `[upstream]` fell back to a node's cap and timeout).
    #[test]
    fn a_named_table_keeps_the_structs_defaults_for_what_it_leaves_out() {
        let f = file("round_ms = 30\n[inner]\n");
        let got: Sample = load_from(Some(&f.0), vec![], "FG_T_", &[]).unwrap();
        assert_eq!((got.round_ms, got.inner.version), (30, 0));
        let got: crate::http::edge::EdgeSettings = load_from(
            Some(&file("[upstream]\nurls = [\"http://127.0.0.1:9\"]\n").0),
            vec![],
            "FG_T_",
            &[],
        )
        .unwrap();
        let defaults = crate::http::edge::EdgeSettings::default();
        assert_eq!(got.upstream.urls, ["http://127.0.0.1:9"]);
        assert_eq!(got.upstream.max_in_flight, defaults.upstream.max_in_flight);
        assert_eq!(
            got.upstream.connect_timeout_ms,
            defaults.upstream.connect_timeout_ms
        );
        assert_ne!(
            defaults.upstream.max_in_flight,
            crate::http::proxy::UpstreamSettings::default().max_in_flight
        );
    }

    /// A line with no `key =` may be a secret: the error names the line, not its text.
    #[test]
    fn a_line_that_is_not_a_setting_is_not_echoed() {
        let secret = "hash_key_hex: \"00112233445566778899aabbccddeeff\"";
        let f = file(&format!("round_ms = 30\n{secret}\n"));
        let err = load_from::<Sample>(Some(&f.0), vec![], "FG_T_", &[]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(":2"), "{text}");
        assert!(!text.contains("00112233"), "{text}");
    }

    fn file(text: &str) -> tempfile_like::Tmp {
        tempfile_like::Tmp::new(text)
    }

    /// A file in the system temp directory, removed on drop (std only).
    mod tempfile_like {
        pub struct Tmp(pub std::path::PathBuf);
        impl Tmp {
            pub fn new(text: &str) -> Self {
                use std::sync::atomic::{AtomicU64, Ordering};
                static N: AtomicU64 = AtomicU64::new(0);
                let p = std::env::temp_dir().join(format!(
                    "foldgate-config-{}-{}.toml",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&p, text).unwrap();
                Self(p)
            }
        }
        impl Drop for Tmp {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn layers_apply_in_order() {
        let f = file("round_ms = 50\n[inner]\nversion = 3\n");
        let env = vec![
            ("FG_T_UPSTREAM".to_string(), "http://u:80".to_string()),
            ("FG_T_INNER__VERSION".to_string(), "4".to_string()),
            ("OTHER".to_string(), "x".to_string()),
        ];
        let got: Sample =
            load_from(Some(&f.0), env, "FG_T_", &["round_ms=75".to_string()]).unwrap();
        assert_eq!(
            got,
            Sample {
                round_ms: 75,
                upstream: "http://u:80".into(),
                inner: Inner { version: 4 },
            }
        );
    }

    #[test]
    fn a_bad_file_names_file_line_key_and_expectation() {
        let f = file("upstream = \"http://x\"\nround_ms = \"fast\"\n");
        let err = load_from::<Sample>(Some(&f.0), vec![], "FG_T_", &[]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&format!("{}:2", f.0.display())), "{text}");
        assert!(text.contains("key `round_ms`"), "{text}");
        assert!(text.contains("expected u32"), "{text}");
    }

    #[test]
    fn unknown_keys_and_bad_overrides_fail() {
        let f = file("rond_ms = 5\n");
        let err = load_from::<Sample>(Some(&f.0), vec![], "FG_T_", &[]).unwrap_err();
        assert!(err.to_string().contains("unknown field `rond_ms`"), "{err}");

        let env = vec![("FG_T_ROUND_MS".to_string(), "-1".to_string())];
        let err = load_from::<Sample>(None, env, "FG_T_", &[]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("env FG_T_ROUND_MS: key `round_ms`"),
            "{text}"
        );

        let err = load_from::<Sample>(None, vec![], "FG_T_", &["round_ms".into()]).unwrap_err();
        assert!(err.to_string().contains("expected key=value"), "{err}");
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let err = load_from::<Sample>(Some(Path::new("/nonexistent/x.toml")), vec![], "P_", &[])
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("/nonexistent/x.toml: cannot read")
        );
    }
}
