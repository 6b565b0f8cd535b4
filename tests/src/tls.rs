//! Certificates for the mTLS tests (B2, A56), made fresh per run with rcgen: a CA, a
//! server certificate for 127.0.0.1, and one client certificate per role. Nothing here is
//! a secret anyone else holds; the directory is removed when dropped.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

pub struct TestPki {
    pub dir: PathBuf,
}

/// The PEM files of one certificate.
pub struct Pem {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestPki {
    /// A CA, `server` (SAN 127.0.0.1 and localhost), and a client certificate per common
    /// name in `roles` (the NATS server maps the subject `CN=<role>` to a user).
    pub fn new(dir: &Path, roles: &[&str]) -> Self {
        std::fs::create_dir_all(dir).expect("pki dir");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "foldgate test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key"))
            .expect("ca");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write ca");
        let leaf = |name: &str, sans: Vec<String>| {
            let key = KeyPair::generate().expect("key");
            let mut p = CertificateParams::new(sans).expect("params");
            p.distinguished_name = rcgen::DistinguishedName::new();
            p.distinguished_name.push(DnType::CommonName, name);
            let cert = p.signed_by(&key, &ca).expect("sign");
            std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).expect("write cert");
            std::fs::write(dir.join(format!("{name}-key.pem")), key.serialize_pem())
                .expect("write key");
        };
        leaf("server", vec!["127.0.0.1".into(), "localhost".into()]);
        for role in roles {
            leaf(role, Vec::new());
        }
        Self {
            dir: dir.to_path_buf(),
        }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn pem(&self, name: &str) -> Pem {
        Pem {
            cert: self.dir.join(format!("{name}.pem")),
            key: self.dir.join(format!("{name}-key.pem")),
        }
    }
}

/// A nats-server config for `TestPki` files in `dir`: TLS with client certificates
/// required and mapped to users by subject (`verify_and_map`), JetStream, and the two
/// roles' permissions (A56). A gateway may publish reports and fast-path requests and
/// never a grant; the fold role may publish grants and use JetStream key-value (its
/// shard leases, `$KV.>` puts and `$JS.>` API calls).
pub fn role_server_config(port: u16, dir: &Path) -> String {
    use bus_schemas::subjects::{
        FAST_PATH_TREE as fast, GRANT_TREE as grant, REPORT_TREE as report,
    };
    let d = dir.display();
    format!(
        r#"
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{d}/js" }}
tls {{
  cert_file: "{d}/server.pem"
  key_file: "{d}/server-key.pem"
  ca_file: "{d}/ca.pem"
  verify_and_map: true
  timeout: 2
}}
authorization {{
  users = [
    {{ user: "CN=gateway", permissions: {{
        publish: {{ allow: ["{report}", "{fast}"] }}
        subscribe: {{ allow: ["{grant}", "_INBOX.>"] }} }} }}
    {{ user: "CN=fold", permissions: {{
        publish: {{ allow: ["{grant}", "_INBOX.>", "$JS.>", "$KV.>"] }}
        subscribe: {{ allow: ["{report}", "{fast}", "{grant}", "_INBOX.>"] }} }} }}
  ]
}}
"#
    )
}

/// A TLS-only nats-server (`role_server_config`) with a fresh PKI holding the gateway and
/// fold roles, and its `tls://` URL.
pub fn start_role_server() -> (crate::nats::NatsServer, TestPki, String) {
    let mut pki_dir = None;
    let server = crate::nats::NatsServer::start_with(|port, dir| {
        let pki = TestPki::new(dir, &["gateway", "fold"]);
        pki_dir = Some(pki.dir.clone());
        Some(role_server_config(port, dir))
    });
    let pki = TestPki {
        dir: pki_dir.expect("pki made"),
    };
    let url = format!("tls://127.0.0.1:{}", server.port);
    (server, pki, url)
}

/// A client of the server at `url` that trusts the PKI's CA and presents `role`'s
/// certificate (`None`: no certificate at all).
pub async fn connect_as(
    url: &str,
    pki: &TestPki,
    role: Option<&str>,
) -> Result<async_nats::Client, async_nats::ConnectError> {
    let ca = pki.ca();
    let pem = role.map(|role| pki.pem(role));
    let cert_and_key = pem.as_ref().map(|p| (p.cert.as_path(), p.key.as_path()));
    foldgate_runtime::nats::connect_options(Some(&ca), cert_and_key)
        .connect(url)
        .await
}
