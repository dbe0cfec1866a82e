//! The OTLP profiles server on another stack (exporters/tests/python/
//! otlp_server.py: grpcio and the official opentelemetry-proto package from
//! PyPI, installed by .ci/exporters.sh), started on loopback. It prints one
//! JSON line per request it answers; see the script for its options.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Checks that the server's Python packages are there (see [`PyOtlpServer::available`]).
const CHECK: &str = "import grpc, importlib.metadata as m\n\
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc\n\
v = m.version('opentelemetry-proto')\n\
assert v.startswith('1.45.'), v";

/// A running server; stopped (stdin closed, waited for) when dropped.
pub struct PyOtlpServer {
    child: Child,
    /// The server's stdout lines after its ports.
    pub lines: mpsc::Receiver<String>,
    pub grpc_port: u16,
    /// With `--http` only.
    pub http_port: Option<u16>,
}

impl PyOtlpServer {
    /// Whether python3 with grpcio and opentelemetry-proto 1.45 is there;
    /// under CI=true its absence fails the test (see [`crate::tools`]).
    pub fn available() -> bool {
        crate::tools::tool_available("python3", &["-c", CHECK])
    }

    /// Starts the script with `args` and reads the ports it listens on.
    pub fn start(args: &[&str]) -> PyOtlpServer {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../exporters/tests/python/otlp_server.py");
        let mut child = Command::new("python3")
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let port = |prefix: &str| -> u16 {
            let l = lines.recv_timeout(Duration::from_secs(30)).expect("the Python server did not start");
            l.strip_prefix(prefix).unwrap_or_else(|| panic!("expected {prefix}<port>, got {l}")).parse().unwrap()
        };
        let grpc_port = port("PORT ");
        let http_port = args.contains(&"--http").then(|| port("HTTP_PORT "));
        PyOtlpServer { child, lines, grpc_port, http_port }
    }
}

impl Drop for PyOtlpServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}
