//! What a batch went through, as spans (`service.telemetry.traces`): one
//! trace per batch and pipeline, rooted at `pipeline/<name>`, with children
//! `receive` (the wait at the pipeline's input), `processor/<id>` per
//! processor, and per exporter `queue_wait/<id>` (queued until a consumer took
//! it) and `export/<id>` per attempt with its `outcome`. A batch a processor
//! holds (batching) ends its trace there; the batch its flush lets go starts
//! one of its own (`profcol.flush: true`).
//!
//! Off (no span processor configured), every hook is one check of an empty
//! `OnceLock`. The sampler (parent-based, trace-id ratio) decides at the root;
//! an unsampled batch carries a non-recording context.

use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use std::sync::OnceLock;
use std::time::SystemTime;

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Turns batch tracing on for this process (once, at start).
pub fn install(provider: &SdkTracerProvider) {
    let _ = TRACER.set(provider.tracer("profcol"));
}

/// Whether batches are traced in this process.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// A batch's place in its trace: the root span's context.
#[derive(Clone, Debug)]
pub struct BatchTrace {
    cx: Context,
}

impl BatchTrace {
    /// Starts the root span of a batch entering pipeline `pipeline` at `since`
    /// (when the receiver handed it over), with its `receive` child.
    pub fn start(pipeline: &str, since: SystemTime, samples: u64, flush: bool) -> Option<BatchTrace> {
        let t = tracer()?;
        let mut attrs = vec![KeyValue::new("profcol.pipeline", pipeline.to_owned()), samples_attr(samples)];
        if flush {
            attrs.push(KeyValue::new("profcol.flush", true));
        }
        let root = t
            .span_builder(format!("pipeline/{pipeline}"))
            .with_kind(SpanKind::Internal)
            .with_start_time(since)
            .with_attributes(attrs)
            .start_with_context(t, &Context::new());
        let cx = Context::new().with_span(root);
        let bt = BatchTrace { cx };
        if !flush {
            bt.child("receive", since, SystemTime::now(), vec![]);
        }
        Some(bt)
    }

    fn sampled(&self) -> bool {
        self.cx.span().span_context().is_sampled()
    }

    /// A finished child span from `start` to `end`.
    pub fn child(&self, name: impl Into<String>, start: SystemTime, end: SystemTime, attrs: Vec<KeyValue>) {
        let Some(t) = tracer().filter(|_| self.sampled()) else { return };
        let mut span =
            t.span_builder(name.into()).with_start_time(start).with_attributes(attrs).start_with_context(t, &self.cx);
        span.end_with_timestamp(end);
    }

    /// Ends the root span (the batch is queued at every exporter, or stopped).
    pub fn end(&self, outcome: &'static str) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("profcol.outcome", outcome));
        span.end();
    }
}

pub fn samples_attr(n: u64) -> KeyValue {
    KeyValue::new("profcol.samples", i64::try_from(n).unwrap_or(i64::MAX))
}
