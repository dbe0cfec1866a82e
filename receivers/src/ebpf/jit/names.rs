//! A perf map line's name in its runtime's terms: function, file and line
//! where the runtime writes them, and the frame type of its code.

use std::sync::Arc;

/// The runtime that wrote a map, told from what the process maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Runtime {
    /// Node.js and other V8 embedders (`--perf-basic-prof`).
    V8,
    /// HotSpot (`jcmd PID Compiler.perfmap`, `-XX:+DumpPerfMapAtExit`,
    /// perf-map-agent).
    Jvm,
    /// .NET (`DOTNET_PerfMapEnabled=1`).
    Dotnet,
    /// wasmtime (`--profile=perfmap`, profcol's own plugins).
    Wasm,
    /// Anything else (LuaJIT, a custom JIT): names kept as written.
    Other,
}

impl Runtime {
    pub(crate) const ALL: [Runtime; 5] = [Runtime::V8, Runtime::Jvm, Runtime::Dotnet, Runtime::Wasm, Runtime::Other];

    /// The `runtime` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Runtime::V8 => "v8",
            Runtime::Jvm => "jvm",
            Runtime::Dotnet => "dotnet",
            Runtime::Wasm => "wasm",
            Runtime::Other => "other",
        }
    }

    /// `profile.frame.type` of its code (OpenTelemetry's values).
    pub(crate) fn frame_type(self) -> &'static str {
        match self {
            Runtime::V8 => "v8js",
            Runtime::Jvm => "jvm",
            Runtime::Dotnet => "dotnet",
            Runtime::Wasm => "wasm",
            Runtime::Other => "native",
        }
    }

    /// The runtime of a process from the base names of the files it maps
    /// executable and its executable's name.
    pub(crate) fn of_process<'a>(exe: &str, files: impl Iterator<Item = &'a str>) -> Runtime {
        let mut found = match exe {
            "node" | "nodejs" | "deno" | "bun" => Some(Runtime::V8),
            "java" => Some(Runtime::Jvm),
            "dotnet" => Some(Runtime::Dotnet),
            "wasmtime" => Some(Runtime::Wasm),
            _ => None,
        };
        for f in files {
            if found.is_some() {
                break;
            }
            found = if f == "libjvm.so" {
                Some(Runtime::Jvm)
            } else if f.starts_with("libnode.so") || f.starts_with("libv8") {
                Some(Runtime::V8)
            } else if f == "libcoreclr.so" {
                Some(Runtime::Dotnet)
            } else {
                None
            };
        }
        found.unwrap_or(Runtime::Other)
    }
}

/// A named piece of JIT code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JitName {
    pub function: Arc<str>,
    /// Empty where the map does not say.
    pub file: Arc<str>,
    /// The code's line: a perf map's is the function's first, a jitdump's
    /// that of the instructions; 0 where the file does not say.
    pub line: u32,
    pub frame_type: &'static str,
}

/// Names map line `raw` written by `runtime`. Every process that maps
/// wasmtime's code writes `wasm[..]::` names whatever its executable.
pub(crate) fn parse(runtime: Runtime, raw: &str) -> JitName {
    let runtime = if raw.starts_with("wasm[") { Runtime::Wasm } else { runtime };
    let frame_type = runtime.frame_type();
    let plain = |f: &str| JitName { function: Arc::from(f), file: Arc::from(""), line: 0, frame_type };
    match runtime {
        Runtime::V8 => v8(raw).unwrap_or_else(|| plain(raw)),
        Runtime::Jvm => plain(&java(raw)),
        Runtime::Dotnet => plain(dotnet(raw)),
        Runtime::Wasm => plain(&profcol_elf::demangle(wasm(raw))),
        Runtime::Other => plain(&profcol_elf::demangle(raw)),
    }
}

/// V8's `KIND:MARKERname FILE:LINE:COLUMN` for script code (`JS:*fib
/// /app/x.js:3:17`; older versions `LazyCompile:` and no column); its
/// builtins, stubs and handlers (`Builtin:ArrayPrototypePush`) stay as
/// written. The marker says which tier compiled it (`*` optimized, `~`
/// interpreted, `^` baseline, `+` maglev): one function either way.
fn v8(raw: &str) -> Option<JitName> {
    let (kind, rest) = raw.split_once(':')?;
    if !matches!(kind, "JS" | "LazyCompile" | "Function" | "Script" | "Eval") {
        return None;
    }
    let rest = rest.trim_start_matches(['*', '~', '^', '+']);
    let (name, place) = match rest.rsplit_once(' ') {
        Some((n, p)) => (n, p),
        // No file: a name alone (`JS:*fib`).
        None => (rest, ""),
    };
    let (file, line) = file_line(place).unwrap_or(("", 0));
    let function = match name {
        "" if matches!(kind, "Script" | "Eval") => "(program)",
        "" => "(anonymous)",
        n => n,
    };
    Some(JitName { function: Arc::from(function), file: Arc::from(file), line, frame_type: "v8js" })
}

/// `FILE:LINE:COLUMN` or `FILE:LINE` (a file may hold colons: `file:///`,
/// `node:internal/...`).
fn file_line(place: &str) -> Option<(&str, u32)> {
    let (head, last) = place.rsplit_once(':')?;
    let last: u32 = last.parse().ok()?;
    match head.rsplit_once(':') {
        Some((file, line)) if !file.is_empty() => match line.parse::<u32>() {
            Ok(line) => Some((file, line)),
            Err(_) => Some((head, last)),
        },
        _ => (!head.is_empty()).then_some((head, last)),
    }
}

/// HotSpot's own map (`double com.example.Hot.work(int)`: return type,
/// class and method, arguments) or perf-map-agent's
/// (`Lcom/example/Foo;::bar`): `com.example.Hot.work`. Stubs and the
/// interpreter (`Interpreter`, `StubRoutines (1)`) stay as written.
fn java(raw: &str) -> String {
    if let Some((class, method)) = raw.split_once(";::") {
        let class = class.strip_prefix('L').unwrap_or(class);
        let method = method.split('(').next().unwrap_or(method);
        return format!("{}.{}", class.replace('/', "."), method);
    }
    match raw.find('(') {
        // The last word before the arguments is the qualified method.
        Some(open) if raw[..open].contains('.') => {
            let head = &raw[..open];
            head.rsplit(' ').next().unwrap_or(head).to_owned()
        }
        _ => raw.to_owned(),
    }
}

/// .NET's `Namespace.Class::Method(args)[OptimizedTier1]`:
/// `Namespace.Class::Method`.
fn dotnet(raw: &str) -> &str {
    let name = raw.split('[').next().unwrap_or(raw);
    name.split('(').next().unwrap_or(name).trim()
}

/// wasmtime's `wasm[MODULE]::function[INDEX]::NAME` (a name only where
/// the module's name section has one, mangled as the guest's compiler
/// wrote it): the name, or the whole line.
fn wasm(raw: &str) -> &str {
    match raw.rsplit_once("]::") {
        Some((_, name)) if !name.is_empty() => name,
        _ => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(r: Runtime, raw: &str) -> (String, String, u32, &'static str) {
        let n = parse(r, raw);
        (n.function.to_string(), n.file.to_string(), n.line, n.frame_type)
    }

    #[test]
    fn v8_script_code_is_function_file_and_line() {
        let v = Runtime::V8;
        assert_eq!(named(v, "JS:*fib /app/x.js:3:17"), ("fib".into(), "/app/x.js".into(), 3, "v8js"));
        assert_eq!(named(v, "LazyCompile:*fib /app/x.js:3"), ("fib".into(), "/app/x.js".into(), 3, "v8js"));
        assert_eq!(named(v, "JS:~ /app/x.js:5:78"), ("(anonymous)".into(), "/app/x.js".into(), 5, "v8js"));
        assert_eq!(named(v, "Eval:~ /app/x.js:1:1"), ("(program)".into(), "/app/x.js".into(), 1, "v8js"));
        assert_eq!(
            named(v, "JS:^Module._compile node:internal/modules/cjs/loader:1358:37"),
            ("Module._compile".into(), "node:internal/modules/cjs/loader".into(), 1358, "v8js")
        );
        assert_eq!(
            named(v, "JS:*handler file:///srv/app.mjs:12:3"),
            ("handler".into(), "file:///srv/app.mjs".into(), 12, "v8js")
        );
        assert_eq!(named(v, "Builtin:ArrayPrototypePush"), ("Builtin:ArrayPrototypePush".into(), "".into(), 0, "v8js"));
        assert_eq!(named(v, "JS:*fib"), ("fib".into(), "".into(), 0, "v8js"));
    }

    #[test]
    fn java_names_become_class_dot_method() {
        let j = Runtime::Jvm;
        assert_eq!(named(j, "double com.example.Hot.work(int)").0, "com.example.Hot.work");
        assert_eq!(named(j, "void java.lang.Object.<init>()").0, "java.lang.Object.<init>");
        assert_eq!(named(j, "Lcom/example/Foo;::bar").0, "com.example.Foo.bar");
        assert_eq!(named(j, "Lcom/example/Foo;::bar(Ljava/lang/String;)V").0, "com.example.Foo.bar");
        assert_eq!(named(j, "Interpreter"), ("Interpreter".into(), "".into(), 0, "jvm"));
        assert_eq!(named(j, "StubRoutines (1)").0, "StubRoutines (1)");
    }

    #[test]
    fn dotnet_wasm_and_other_names() {
        assert_eq!(named(Runtime::Dotnet, "App.Program::Main(string[])[OptimizedTier1]").0, "App.Program::Main");
        assert_eq!(named(Runtime::Other, "wasm[0]::function[12]::hot_loop"), ("hot_loop".into(), "".into(), 0, "wasm"));
        assert_eq!(named(Runtime::Other, "wasm[0]::function[12]").1, "");
        // wasmtime's lines for a Rust plugin: mangled names, prefixed.
        assert_eq!(
            named(Runtime::Other, "wasm[0]::function[109]::_ZN9misbehave7recurse17hdd926f25b7b4a6f1E").0,
            "misbehave::recurse"
        );
        assert_eq!(
            named(Runtime::Other, "TRACE_3::app.lua:10"),
            ("TRACE_3::app.lua:10".into(), "".into(), 0, "native")
        );
    }

    #[test]
    fn runtimes_are_told_from_the_process() {
        assert_eq!(Runtime::of_process("node", std::iter::empty()), Runtime::V8);
        assert_eq!(Runtime::of_process("myapp", ["libc.so.6", "libjvm.so"].into_iter()), Runtime::Jvm);
        assert_eq!(Runtime::of_process("x", ["libcoreclr.so"].into_iter()), Runtime::Dotnet);
        assert_eq!(Runtime::of_process("luajit", ["libc.so.6"].into_iter()), Runtime::Other);
    }
}
