//! A helper process (a test server on another stack) that prints its ports
//! and then one line per event on stdout, and stops when its stdin closes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The running process and its stdout lines, as they come.
pub struct LineServer {
    child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl LineServer {
    /// Spawns `cmd` with piped stdin and stdout.
    pub fn spawn(mut cmd: Command) -> LineServer {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("the helper process starts");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        LineServer { child, lines }
    }

    /// The port of the next line, which must read `<prefix><port>` (within 30 s).
    pub fn port(&self, prefix: &str) -> u16 {
        let l = self.lines.recv_timeout(Duration::from_secs(30)).expect("the helper process did not start");
        l.strip_prefix(prefix).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("expected {prefix}<port>: {l}"))
    }
}

impl Drop for LineServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}
