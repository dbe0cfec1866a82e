//! Pieces of the YAML configs that tests and benches hand to profcol.

/// A `receivers:` section with one otlp receiver, gRPC on a loopback port the
/// kernel picks (profcol logs it); YAML may continue with more of its keys
/// at the `grpc:` (8 spaces) or `otlp:` (4 spaces) level.
pub const OTLP_GRPC_RECEIVER: &str = "receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:0
";

/// An `exporters:` section with one `otlp` exporter to 127.0.0.1:`port` that
/// retries quickly and never gives up (200 ms to 1 s apart, 2 s per attempt):
/// what outage tests want. YAML may continue with more of its keys (4 spaces).
pub fn otlp_exporter_retrying(port: u16) -> String {
    format!(
        "exporters:
  otlp:
    endpoint: http://127.0.0.1:{port}
    timeout: 2s
    retry_on_failure:
      initial_interval: 200ms
      max_interval: 1s
      max_elapsed_time: 0s
"
    )
}

/// The `service:` section with one `profiles` pipeline of the named
/// components (comma-separated; `processors` may be empty) and the host's
/// own metrics endpoint off, so a test takes no port it did not ask for.
pub fn one_pipeline(receivers: &str, processors: &str, exporters: &str) -> String {
    let processors = if processors.is_empty() { String::new() } else { format!("      processors: [{processors}]\n") };
    format!(
        "service:
  telemetry:
    metrics:
      address: \"\"
  pipelines:
    profiles:
      receivers: [{receivers}]
{processors}      exporters: [{exporters}]
"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn processors_are_listed_only_when_named() {
        let with = super::one_pipeline("otlp", "batch", "otlp, file");
        assert!(with.contains("\n      processors: [batch]\n      exporters: [otlp, file]\n"), "{with}");
        let without = super::one_pipeline("file", "", "otlp");
        assert!(!without.contains("processors") && without.ends_with("receivers: [file]\n      exporters: [otlp]\n"));
    }
}
