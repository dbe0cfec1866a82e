//! Splitting a batch's samples into groups (`group_by: none | process |
//! container`): the group a sample belongs to and the bound on their
//! number; shared by `pprof` and `flamegraph`.

use crate::file_names::sanitize;
use crate::sample_attrs::SampleAttrs;
use profcol_api::model::AnyValue;
use serde::{Deserialize, Serialize};

/// `group_by`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    /// One report per batch.
    #[default]
    None,
    /// One report per process (`process.pid`).
    Process,
    /// One report per container (`container.id`; samples outside containers go to `host`).
    Container,
}

/// Most groups a batch is split into; the samples of further groups go to
/// [`OVERFLOW_GROUP`] (a pprof report still tells their processes apart by
/// the `pid` label), so that a batch of many processes or containers cannot
/// make a report (and its memory) per sample.
pub(crate) const MAX_GROUPS: usize = 1024;

/// The group of every sample with `group_by: none`.
pub(crate) const ALL_GROUP: &str = "all";

/// The group of the samples past [`MAX_GROUPS`].
pub(crate) const OVERFLOW_GROUP: &str = "other";

/// The sample types whose profiles go to reports of their own, named
/// `<group>-<type>` (`-off_cpu`, `-wakeup`): wait times are no CPU
/// samples, a pprof reader takes a report's period and default type from
/// its first column, and a flame graph sums whatever it is given.
const OWN_REPORT_TYPES: [&str; 2] = ["off_cpu", "wakeup"];

/// The report suffix of sample type `t`, when its profiles have their own.
pub(crate) fn own_report_type(t: &str) -> Option<&'static str> {
    OWN_REPORT_TYPES.iter().copied().find(|&o| o == t)
}

/// Longest process id kept in a group name (which is part of a file name).
const MAX_PID_CHARS: usize = 64;

/// `group`, or [`OVERFLOW_GROUP`] when `groups` already holds [`MAX_GROUPS`]
/// other groups.
pub(crate) fn bounded_group<V>(groups: &std::collections::BTreeMap<String, V>, group: String) -> String {
    if groups.len() < MAX_GROUPS || groups.contains_key(&group) {
        group
    } else {
        OVERFLOW_GROUP.into()
    }
}

/// The first `n` characters of `s`, made safe for a file name.
fn clipped(s: &str, n: usize) -> String {
    sanitize(&s.chars().take(n).collect::<String>())
}

/// The name of the group of samples whose `group_by` attribute is `value`,
/// as it appears in file names.
fn name(by: GroupBy, value: Option<&AnyValue>) -> String {
    let text = value.and_then(profcol_model_rules::folded::value_text);
    match by {
        GroupBy::None => ALL_GROUP.into(),
        GroupBy::Process => match text {
            Some(pid) => format!("pid-{}", clipped(&pid, MAX_PID_CHARS)),
            None => "pid-unknown".into(),
        },
        GroupBy::Container => match text {
            Some(c) => format!("container-{}", clipped(&c, 24)),
            None => "host".into(),
        },
    }
}

/// Names the groups of samples one after another: a name is made once
/// while consecutive samples share the attribute value it is made of (that
/// of their resource, or the same dictionary entry).
pub(crate) struct GroupNames<'a> {
    by: GroupBy,
    /// The last value by its address, and its name.
    last: Option<(*const AnyValue, String)>,
    /// The values outlive the namer, so an address stays one value's.
    _values: std::marker::PhantomData<&'a AnyValue>,
}

impl<'a> GroupNames<'a> {
    pub(crate) fn new(by: GroupBy) -> Self {
        GroupNames { by, last: None, _values: std::marker::PhantomData }
    }

    /// The group of a sample of attributes `attrs`.
    pub(crate) fn of(&mut self, attrs: &SampleAttrs<'a>) -> &str {
        let value = match self.by {
            GroupBy::None => return ALL_GROUP,
            GroupBy::Process => attrs.pid_value(),
            GroupBy::Container => attrs.container_value(),
        };
        let key = value.map_or(std::ptr::null(), |v| v as *const AnyValue);
        if self.last.as_ref().is_none_or(|(k, _)| *k != key) {
            self.last = Some((key, name(self.by, value)));
        }
        self.last.as_ref().map_or(ALL_GROUP, |(_, n)| n)
    }
}
