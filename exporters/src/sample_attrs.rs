//! The attributes reports read of each sample (its process, thread and
//! container), all found in one pass over the sample's attributes; those it
//! lacks come from its resource, read once for the samples that share it.

use profcol_api::model::view::SampleView;
use profcol_api::model::{any_value, keys, AnyValue, Resource};
use std::borrow::Cow;

/// The keys read, in the order of [`SampleAttrs`]' fields.
const KEYS: [&str; 7] = [
    keys::PROCESS_PID,
    keys::THREAD_ID,
    keys::THREAD_NAME,
    keys::PROCESS_EXECUTABLE_NAME,
    keys::CONTAINER_ID,
    keys::OFF_CPU_STATE,
    keys::OFF_CPU_WAKEUP,
];

/// Position of `key` in [`KEYS`].
fn slot(key: &str) -> Option<usize> {
    match key {
        keys::PROCESS_PID => Some(0),
        keys::THREAD_ID => Some(1),
        keys::THREAD_NAME => Some(2),
        keys::PROCESS_EXECUTABLE_NAME => Some(3),
        keys::CONTAINER_ID => Some(4),
        keys::OFF_CPU_STATE => Some(5),
        keys::OFF_CPU_WAKEUP => Some(6),
        _ => None,
    }
}

/// A value that reads as text or a number (what
/// `profcol_model_rules::folded::value_text` prints), told without printing it.
fn readable(v: &AnyValue) -> bool {
    use any_value::Value::*;
    matches!(v.value, Some(StringValue(_) | IntValue(_) | BoolValue(_) | DoubleValue(_)))
}

/// Each of [`KEYS`] of one sample: the sample's attribute, else its
/// resource's (the first with the key, on each), when its value is readable.
#[derive(Clone, Copy, Default)]
pub(crate) struct SampleAttrs<'a>([Option<&'a AnyValue>; KEYS.len()]);

impl<'a> SampleAttrs<'a> {
    /// `process.pid` as a number (a string holding one included).
    pub(crate) fn pid(&self) -> Option<i64> {
        int(self.0[0])
    }

    /// `process.pid` as it is.
    pub(crate) fn pid_value(&self) -> Option<&'a AnyValue> {
        self.0[0]
    }

    /// `thread.id` as a number.
    pub(crate) fn tid(&self) -> Option<i64> {
        int(self.0[1])
    }

    /// The thread's name, else the executable's.
    pub(crate) fn comm(&self) -> Option<Cow<'a, str>> {
        text(self.0[2].or(self.0[3]))
    }

    /// `container.id` as it is.
    pub(crate) fn container_value(&self) -> Option<&'a AnyValue> {
        self.0[4]
    }

    /// How an off-CPU sample's thread left the CPU.
    pub(crate) fn off_cpu_state(&self) -> Option<Cow<'a, str>> {
        text(self.0[5])
    }

    /// The number tying an off-CPU sample to its waker's `wakeup` sample.
    pub(crate) fn wakeup(&self) -> Option<i64> {
        int(self.0[6])
    }
}

fn text(v: Option<&AnyValue>) -> Option<Cow<'_, str>> {
    profcol_model_rules::folded::value_text(v?)
}

fn int(v: Option<&AnyValue>) -> Option<i64> {
    match v?.value.as_ref()? {
        any_value::Value::IntValue(i) => Some(*i),
        any_value::Value::StringValue(v) => v.parse().ok(),
        _ => None,
    }
}

/// Reads [`SampleAttrs`] sample after sample, keeping the last resource's
/// (the samples of one resource come one after another).
#[derive(Default)]
pub(crate) struct AttrReader<'a> {
    resource: Option<(*const Resource, SampleAttrs<'a>)>,
}

impl<'a> AttrReader<'a> {
    pub(crate) fn read(&mut self, s: &SampleView<'a>) -> SampleAttrs<'a> {
        let mut seen = [false; KEYS.len()];
        let mut out = SampleAttrs::default();
        let mut left = KEYS.len();
        for (k, v) in s.attributes() {
            let Some(i) = slot(k) else { continue };
            if !seen[i] {
                seen[i] = true;
                out.0[i] = v.filter(|v| readable(v));
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        if out.0.iter().all(Option::is_some) {
            return out;
        }
        let resource = self.of_resource(s.resource);
        for (mine, theirs) in out.0.iter_mut().zip(resource.0) {
            if mine.is_none() {
                *mine = theirs;
            }
        }
        out
    }

    fn of_resource(&mut self, r: Option<&'a Resource>) -> SampleAttrs<'a> {
        let key = r.map_or(std::ptr::null(), |r| r as *const Resource);
        if let Some((k, attrs)) = self.resource {
            if k == key {
                return attrs;
            }
        }
        let mut seen = [false; KEYS.len()];
        let mut attrs = SampleAttrs::default();
        for kv in r.map_or(&[][..], |r| &r.attributes) {
            let Some(i) = slot(&kv.key) else { continue };
            if !seen[i] {
                seen[i] = true;
                attrs.0[i] = kv.value.as_ref().filter(|v| readable(v));
            }
        }
        self.resource = Some((key, attrs));
        attrs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_api::model::{pb, AttrValue, KeyValue, ProfileMeta};
    use profcol_api::ProfilesBuilder;

    #[test]
    fn keys_and_slots_agree() {
        for (i, k) in KEYS.iter().enumerate() {
            assert_eq!(slot(k), Some(i), "{k}");
        }
        assert_eq!(slot("service.name"), None);
    }

    #[test]
    fn readable_is_what_has_text() {
        use any_value::Value;
        let values = [
            None,
            Some(Value::StringValue("x".into())),
            Some(Value::IntValue(7)),
            Some(Value::BoolValue(true)),
            Some(Value::DoubleValue(1.5)),
            Some(Value::BytesValue(vec![1])),
            Some(Value::ArrayValue(Default::default())),
            Some(Value::KvlistValue(Default::default())),
        ];
        for value in values {
            let v = AnyValue { value };
            assert_eq!(readable(&v), profcol_model_rules::folded::value_text(&v).is_some(), "{v:?}");
        }
    }

    fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue { key: key.into(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
    }

    /// The sample's first attribute of a key wins, else the resource's first
    /// (an unreadable one on the sample falls back to the resource, a
    /// readable one that is not a number does not); one reader over samples
    /// of two resources keeps them apart.
    #[test]
    fn the_sample_first_then_its_resource() {
        use any_value::Value;
        let mut b = ProfilesBuilder::new();
        let r1 = b.resource(Resource {
            attributes: vec![
                kv(keys::PROCESS_PID, Value::IntValue(10)),
                kv(keys::PROCESS_PID, Value::IntValue(11)),
                kv(keys::THREAD_ID, Value::StringValue("12".into())),
                kv(keys::PROCESS_EXECUTABLE_NAME, Value::StringValue("exe".into())),
                kv(keys::CONTAINER_ID, Value::BytesValue(vec![1])),
            ],
            ..Default::default()
        });
        let r2 =
            b.resource(Resource { attributes: vec![kv(keys::PROCESS_PID, Value::IntValue(20))], ..Default::default() });
        let p1 = b.profile(r1, &ProfileMeta::cpu(1, 0, 0));
        let p2 = b.profile(r2, &ProfileMeta::cpu(1, 0, 0));
        let tid = b.attribute(keys::THREAD_ID, AttrValue::Int(5));
        let tid_again = b.attribute(keys::THREAD_ID, AttrValue::Int(6));
        let name = b.attribute(keys::THREAD_NAME, AttrValue::Str("worker"));
        let pid_bytes = b.attribute(keys::PROCESS_PID, AttrValue::Bytes(&[1]));
        let pid_bool = b.attribute(keys::PROCESS_PID, AttrValue::Bool(true));
        for (p, attribute_indices) in
            [(p1, vec![tid, tid_again, name]), (p1, vec![pid_bytes]), (p2, vec![pid_bool]), (p1, vec![])]
        {
            b.sample(p, pb::Sample { attribute_indices, values: vec![1], ..Default::default() });
        }
        let batch = b.build();
        let mut reader = AttrReader::default();
        let got: Vec<_> = batch
            .samples()
            .map(|s| {
                let a = reader.read(&s);
                let shown = |v: Option<&AnyValue>| v.and_then(|v| text(Some(v))).map(Cow::into_owned);
                (a.pid(), shown(a.pid_value()), a.tid(), a.comm().map(Cow::into_owned), shown(a.container_value()))
            })
            .collect();
        let s = |v: &str| Some(v.to_owned());
        assert_eq!(
            got,
            [
                (Some(10), s("10"), Some(5), s("worker"), None),
                (Some(10), s("10"), Some(12), s("exe"), None),
                (Some(10), s("10"), Some(12), s("exe"), None),
                (None, s("true"), None, None, None),
            ]
        );
    }
}
