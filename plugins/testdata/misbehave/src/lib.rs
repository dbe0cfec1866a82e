//! A processor plugin that misbehaves as its config says (`{"mode": ...}`).
//! Every mode that returns normally hands the input back unchanged.

use exports::profcol::plugin::process_batch::Guest;
use profcol::plugin::host::{counter_add, log, Level};
use profcol::plugin::types::{ErrorKind, PluginError};
use serde::Deserialize;
use std::hint::black_box;
use std::sync::Mutex;

wit_bindgen::generate!({ path: "../../wit", world: "processor" });

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Config {
    /// pass, loop, bomb, alloc, recurse, trap, trap_second, garbage, fixed,
    /// drop, retryable, permanent, read_file, env, socket, log_flood,
    /// panic_logged, refuse_init
    /// (an absent config, `null`, is mode pass)
    mode: String,
    /// alloc: MiB to allocate; garbage: MiB to return; socket: address;
    /// read_file: path; env: name; panic_logged: the panic message.
    mb: usize,
    arg: String,
    /// fixed: bytes to return, as hex.
    hex: String,
    /// init panics while this environment variable is set (and granted).
    init_panic_env: String,
}

static CONFIG: Mutex<Option<Config>> = Mutex::new(None);
/// Calls this instance has seen (trap_second traps on the second).
static CALLS: Mutex<u64> = Mutex::new(0);

const CALLS_COUNTER: &str = if cfg!(feature = "v2") { "v2_calls" } else { "v1_calls" };

fn fail(kind: ErrorKind, message: String) -> PluginError {
    PluginError { kind, message }
}

/// Recursion without end (the guard never holds); not a tail call, so
/// every level takes a frame of the wasm stack.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if depth == u64::MAX {
        return 0;
    }
    recurse(depth + 1).wrapping_mul(3).wrapping_add(depth)
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()).collect()
}

struct Plugin;

impl Guest for Plugin {
    fn init(config: String) -> Result<(), String> {
        let c: Option<Config> = serde_json::from_str(&config).map_err(|e| format!("bad config: {e}"))?;
        let c = c.unwrap_or_default();
        if !c.init_panic_env.is_empty() && std::env::var(&c.init_panic_env).is_ok() {
            panic!("init panics on purpose");
        }
        if c.mode == "refuse_init" {
            return Err("this config is refused on purpose".into());
        }
        *CONFIG.lock().unwrap() = Some(c);
        Ok(())
    }

    fn process(batch: Vec<u8>) -> Result<Option<Vec<u8>>, PluginError> {
        let c = CONFIG.lock().unwrap().clone().unwrap_or_default();
        let calls = {
            let mut n = CALLS.lock().unwrap();
            *n += 1;
            *n
        };
        counter_add(CALLS_COUNTER, 1);
        match c.mode.as_str() {
            "" | "pass" => Ok(Some(batch)),
            "loop" => {
                let mut i = 0u64;
                loop {
                    i = black_box(i.wrapping_add(1));
                }
            }
            "bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            "alloc" => {
                let v = black_box(vec![1u8; c.mb << 20]);
                counter_add("allocated_mib", (v.len() >> 20) as u64);
                Ok(Some(batch))
            }
            "recurse" => {
                black_box(recurse(black_box(0)));
                Ok(Some(batch))
            }
            "trap" => panic!("trap on purpose"),
            "trap_second" if calls == 2 => panic!("trap on this instance's second call"),
            "trap_second" => Ok(Some(batch)),
            // mb: that many MiB of garbage (past wasmtime's default 128 MiB hostcall limit).
            "garbage" => Ok(Some(vec![0xff; if c.mb > 0 { c.mb << 20 } else { 64 }])),
            "panic_logged" => {
                eprintln!("about to fail: {}", c.arg);
                panic!("the reason is {}", c.arg)
            }
            "fixed" => Ok(Some(unhex(&c.hex))),
            "drop" => Ok(None),
            "drop_error" => Err(fail(ErrorKind::Drop, "not wanted".into())),
            "retryable" => Err(fail(ErrorKind::Retryable, "try later".into())),
            "permanent" => Err(fail(ErrorKind::Permanent, "cannot do this one".into())),
            "read_file" => match std::fs::read(&c.arg) {
                Ok(data) => {
                    counter_add("read_bytes", data.len() as u64);
                    Ok(Some(batch))
                }
                Err(e) => Err(fail(ErrorKind::Permanent, format!("read {}: {e}", c.arg))),
            },
            "env" => match std::env::var(&c.arg) {
                Ok(v) => {
                    counter_add("env_bytes", v.len() as u64);
                    Ok(Some(batch))
                }
                Err(e) => Err(fail(ErrorKind::Permanent, format!("env {}: {e}", c.arg))),
            },
            "socket" => match std::net::TcpStream::connect(&c.arg) {
                Ok(_) => {
                    counter_add("connected", 1);
                    Ok(Some(batch))
                }
                Err(e) => Err(fail(ErrorKind::Permanent, format!("connect {}: {e}", c.arg))),
            },
            "wall_clock" => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                counter_add("wall_clock_secs", secs);
                Ok(Some(batch))
            }
            "log_flood" => {
                for i in 0..10_000 {
                    log(Level::Info, &format!("line {i}"));
                }
                Ok(Some(batch))
            }
            other => Err(fail(ErrorKind::Permanent, format!("unknown mode {other:?}"))),
        }
    }
}

export!(Plugin);
