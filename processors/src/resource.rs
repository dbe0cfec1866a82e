//! `resource` processor: sets, changes and removes resource attributes, as
//! the OTel Collector's resource processor does (`insert`, `update`,
//! `upsert`, `delete`). Values may be `${env:...}` references, expanded when
//! the config loads: a DaemonSet's agent names its node with
//! `value: ${env:K8S_NODE_NAME}` from the downward API.

use async_trait::async_trait;
use profcol_api::component::{Component, Factory, FactoryMeta, Kind, Stability};
use profcol_api::model::{any_value, AnyValue, KeyValue, Resource};
use profcol_api::{ProcessError, ProcessOutcome, Processor, Profiles};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// `processors: resource: { attributes: [...] }`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ResourceConfig {
    /// Actions applied in order to every resource of every batch.
    pub attributes: Vec<AttributeAction>,
}

/// One action on one resource attribute.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AttributeAction {
    /// The attribute's key, e.g. `k8s.node.name`.
    pub key: String,
    /// `insert` (only where the key is absent), `update` (only where it is
    /// present), `upsert` (both) or `delete`.
    pub action: Action,
    /// The value (string, integer, double or boolean) for insert/update/upsert;
    /// `${env:NAME}` is expanded when the config loads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub value: Option<serde_json::Value>,
    /// Instead of `value`: the value of this other resource attribute (the
    /// action does nothing on a resource that lacks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_attribute: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Insert,
    Update,
    Upsert,
    Delete,
}

impl profcol_api::config::Validate for ResourceConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        if self.attributes.is_empty() {
            p.add("attributes", "is empty; list at least one {key, action, value} (or remove the processor)");
        }
        for (i, a) in self.attributes.iter().enumerate() {
            let at = format!("attributes.{i}");
            if a.key.trim().is_empty() {
                p.add(&format!("{at}.key"), "is empty; name the resource attribute, e.g. k8s.node.name");
            }
            match (a.action, &a.value, &a.from_attribute) {
                (Action::Delete, None, None) => {}
                (Action::Delete, _, _) => p.add(&at, "delete takes no value or from_attribute; remove them"),
                (_, Some(_), Some(_)) => p.add(&at, "set value or from_attribute, not both"),
                (_, None, None) => p.add(
                    &format!("{at}.value"),
                    format!("is missing: {:?} needs a value (or from_attribute)", a.action),
                ),
                (_, Some(v), None) => {
                    if any_value(v).is_none() {
                        p.add(
                            &format!("{at}.value"),
                            format!("{v} is not a string, number or boolean; quote it to set it as text"),
                        );
                    }
                }
                (_, None, Some(from)) => {
                    if from.trim().is_empty() {
                        p.add(&format!("{at}.from_attribute"), "is empty; name the attribute to copy");
                    }
                }
            }
        }
    }
}

/// A config value as an attribute value: scalars only.
fn any_value(v: &serde_json::Value) -> Option<AnyValue> {
    let value = match v {
        serde_json::Value::String(s) => any_value::Value::StringValue(s.clone()),
        serde_json::Value::Bool(b) => any_value::Value::BoolValue(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => any_value::Value::IntValue(i),
            None => any_value::Value::DoubleValue(n.as_f64()?),
        },
        _ => return None,
    };
    Some(AnyValue { value: Some(value) })
}

pub fn factory() -> Arc<dyn Factory> {
    profcol_api::component::factory::<ResourceConfig, _>(
        FactoryMeta {
            type_name: "resource",
            kind: Kind::Processor,
            stability: Stability::Beta,
            description: "inserts, updates, upserts or deletes resource attributes (values may be ${env:...})",
        },
        |_set, cfg: ResourceConfig| Ok(Component::Processor(Arc::new(ResourceProcessor::new(&cfg)))),
    )
}

/// An action with its value converted once.
enum Step {
    Set { key: String, value: Source, insert: bool, update: bool },
    Delete { key: String },
}

enum Source {
    Value(AnyValue),
    From(String),
}

pub(crate) struct ResourceProcessor {
    steps: Vec<Step>,
}

impl ResourceProcessor {
    pub(crate) fn new(cfg: &ResourceConfig) -> Self {
        let steps = cfg
            .attributes
            .iter()
            .filter_map(|a| {
                let key = a.key.trim().to_owned();
                let source = match (&a.value, &a.from_attribute) {
                    (Some(v), _) => Source::Value(any_value(v)?),
                    (None, Some(f)) => Source::From(f.trim().to_owned()),
                    (None, None) => Source::Value(AnyValue::default()),
                };
                Some(match a.action {
                    Action::Delete => Step::Delete { key },
                    Action::Insert => Step::Set { key, value: source, insert: true, update: false },
                    Action::Update => Step::Set { key, value: source, insert: false, update: true },
                    Action::Upsert => Step::Set { key, value: source, insert: true, update: true },
                })
            })
            .collect();
        ResourceProcessor { steps }
    }

    /// Applies every step to one resource.
    pub(crate) fn apply(&self, r: &mut Resource) {
        for step in &self.steps {
            match step {
                Step::Delete { key } => r.attributes.retain(|kv| kv.key != *key),
                Step::Set { key, value, insert, update } => {
                    let value = match value {
                        Source::Value(v) => v.clone(),
                        Source::From(from) => match r.attributes.iter().find(|kv| kv.key == *from) {
                            Some(kv) => kv.value.clone().unwrap_or_default(),
                            None => continue,
                        },
                    };
                    match r.attributes.iter_mut().find(|kv| kv.key == *key) {
                        Some(kv) if *update => kv.value = Some(value),
                        Some(_) => {}
                        None if *insert => {
                            r.attributes.push(KeyValue { key: key.clone(), value: Some(value), ..Default::default() })
                        }
                        None => {}
                    }
                }
            }
        }
    }
}

#[async_trait]
impl Processor for ResourceProcessor {
    /// Touches resources only, never a sample.
    fn reads_packed(&self) -> bool {
        true
    }

    async fn process(&self, mut batch: Profiles) -> Result<ProcessOutcome, ProcessError> {
        for rp in &mut batch.0.resource_profiles {
            self.apply(rp.resource.get_or_insert_with(Resource::default));
        }
        Ok(ProcessOutcome::Forward(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_api::config::Validate;

    fn config(yaml: &str) -> ResourceConfig {
        profcol_config::parse_section(yaml).unwrap().decode().unwrap()
    }

    fn problems(yaml: &str) -> Vec<String> {
        let mut p = profcol_api::config::Problems::new();
        config(yaml).validate(&mut p);
        p.into_errors().into_iter().map(|e| format!("{}: {}", e.path, e.message)).collect()
    }

    fn text(v: &str) -> AnyValue {
        AnyValue { value: Some(any_value::Value::StringValue(v.into())) }
    }

    fn attrs(r: &Resource) -> Vec<(String, Option<AnyValue>)> {
        r.attributes.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect()
    }

    #[test]
    fn insert_update_upsert_delete_as_the_otel_processor_does() {
        let p = ResourceProcessor::new(&config(
            "attributes:
  - {key: k8s.node.name, value: node-7, action: upsert}
  - {key: host.name, value: from-config, action: insert}
  - {key: service.name, value: renamed, action: update}
  - {key: absent, value: x, action: update}
  - {key: secret, action: delete}
  - {key: copy, from_attribute: host.name, action: insert}
  - {key: port, value: 4317, action: upsert}
  - {key: ratio, value: 0.5, action: upsert}
  - {key: on, value: true, action: upsert}",
        ));
        let mut r = Resource {
            attributes: vec![
                KeyValue { key: "host.name".into(), value: Some(text("h1")), ..Default::default() },
                KeyValue { key: "secret".into(), value: Some(text("s")), ..Default::default() },
                KeyValue { key: "k8s.node.name".into(), value: Some(text("old")), ..Default::default() },
            ],
            ..Default::default()
        };
        p.apply(&mut r);
        let int = |i| Some(AnyValue { value: Some(any_value::Value::IntValue(i)) });
        let dbl = |d| Some(AnyValue { value: Some(any_value::Value::DoubleValue(d)) });
        let bool_ = |b| Some(AnyValue { value: Some(any_value::Value::BoolValue(b)) });
        assert_eq!(
            attrs(&r),
            vec![
                ("host.name".into(), Some(text("h1"))),
                ("k8s.node.name".into(), Some(text("node-7"))),
                ("copy".into(), Some(text("h1"))),
                ("port".into(), int(4317)),
                ("ratio".into(), dbl(0.5)),
                ("on".into(), bool_(true)),
            ]
        );
    }

    #[tokio::test]
    async fn every_resource_of_a_batch_gets_it_even_one_without_a_resource() {
        let p = ResourceProcessor::new(&config("attributes: [{key: k8s.node.name, value: n1, action: insert}]"));
        let mut batch = profcol_api::Profiles::empty();
        batch.0.resource_profiles = vec![Default::default(), Default::default()];
        let ProcessOutcome::Forward(out) = p.process(batch).await.unwrap() else { panic!("forwarded") };
        for rp in &out.0.resource_profiles {
            assert_eq!(attrs(rp.resource.as_ref().unwrap()), vec![("k8s.node.name".into(), Some(text("n1")))]);
        }
    }

    #[test]
    fn bad_actions_are_config_errors() {
        let e = problems("attributes: [{key: a, action: upsert}]");
        assert!(e.iter().any(|m| m.contains("attributes.0.value: is missing")), "{e:?}");
        let e = problems("attributes: [{key: a, action: delete, value: x}]");
        assert!(e.iter().any(|m| m.contains("delete takes no value")), "{e:?}");
        let e = problems("attributes: [{key: '', action: insert, value: [1, 2]}]");
        assert!(e.iter().any(|m| m.contains("key: is empty")), "{e:?}");
        assert!(e.iter().any(|m| m.contains("not a string, number or boolean")), "{e:?}");
        let e = problems("attributes: []");
        assert!(e.iter().any(|m| m.starts_with("attributes: is empty")), "{e:?}");
        assert!(profcol_config::parse_section("attributes: [{key: a, action: hash}]")
            .unwrap()
            .decode::<ResourceConfig>()
            .is_err());
    }
}
