//! The collector's own resource: the defaults an operator of an OTel
//! Collector fleet expects, merged with `service.telemetry.resource`.

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use std::collections::BTreeMap;

/// `service.name`, `service.version`, `service.instance.id`, `host.name`,
/// then the configured attributes (a null value removes a default).
pub fn build(configured: &BTreeMap<String, Option<String>>, config_sources: &[String]) -> Resource {
    let mut attrs: BTreeMap<String, String> = BTreeMap::new();
    let host = host_name();
    attrs.insert("service.name".into(), "profcol".into());
    attrs.insert("service.version".into(), env!("CARGO_PKG_VERSION").into());
    attrs.insert("service.instance.id".into(), instance_id(&machine_id(&host), config_sources));
    attrs.insert("host.name".into(), host);
    for (k, v) in configured {
        match v {
            Some(v) => attrs.insert(k.clone(), v.clone()),
            None => attrs.remove(k),
        };
    }
    Resource::builder_empty().with_attributes(attrs.into_iter().map(|(k, v)| KeyValue::new(k, v))).build()
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // within it or truncates.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The machine's id (systemd's), or the host name where there is none.
fn machine_id(host: &str) -> String {
    ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()))
        .unwrap_or_else(|| host.to_owned())
}

/// A UUID that stays the same across restarts of the same agent: derived
/// from the machine id and the config sources it runs (two agents with
/// different configs on one machine get different ids), in the RFC 9562
/// layout of a name-based (version 8, SHA-256) UUID.
pub fn instance_id(machine: &str, config_sources: &[String]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"profcol.service.instance.id\0");
    ctx.update(machine.as_bytes());
    for s in config_sources {
        ctx.update(b"\0");
        ctx.update(s.as_bytes());
    }
    let d = ctx.finish();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d.as_ref()[..16]);
    b[6] = (b[6] & 0x0f) | 0x80; // version 8
    b[8] = (b[8] & 0x3f) | 0x80; // RFC variant
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_id_is_a_stable_uuid_per_machine_and_config() {
        let a = instance_id("m1", &["/etc/profcol.yaml".into()]);
        assert_eq!(a, instance_id("m1", &["/etc/profcol.yaml".into()]));
        assert_ne!(a, instance_id("m2", &["/etc/profcol.yaml".into()]));
        assert_ne!(a, instance_id("m1", &["/etc/other.yaml".into()]));
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "8", "version 8: {a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "RFC variant: {a}");
    }

    #[test]
    fn configured_attributes_override_and_null_removes() {
        let mut c = BTreeMap::new();
        c.insert("service.name".to_owned(), Some("edge".to_owned()));
        c.insert("host.name".to_owned(), None);
        c.insert("deployment.environment".to_owned(), Some("prod".to_owned()));
        let r = build(&c, &[]);
        let get = |k: &str| r.get(&opentelemetry::Key::from(k.to_owned())).map(|v| v.to_string());
        assert_eq!(get("service.name").as_deref(), Some("edge"));
        assert_eq!(get("host.name"), None);
        assert_eq!(get("deployment.environment").as_deref(), Some("prod"));
        assert_eq!(get("service.version").as_deref(), Some(env!("CARGO_PKG_VERSION")));
    }
}
