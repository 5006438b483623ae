//! A call's span tree, as a subscriber sees it, against a real server on 127.0.0.1. In a
//! process of its own: the subscriber is the thread's default, and no other test races it.

mod observe;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use observe::{call, fetcher, paced, throttles_once};

/// A span as the capture saw it.
#[derive(Clone, Debug, Default)]
struct SpanRecord {
    name: String,
    parent: Option<usize>,
    fields: HashMap<String, String>,
}

/// An event, its fields and the span it happened in.
#[derive(Clone, Debug)]
struct EventRecord {
    message: String,
    fields: HashMap<String, String>,
    span: Option<usize>,
}

/// Spans are numbered in creation order: the registry reuses the ids of closed spans.
#[derive(Default)]
struct Captured {
    spans: Vec<SpanRecord>,
    /// The record of each live span id.
    live: HashMap<u64, usize>,
    events: Vec<EventRecord>,
}

/// Records every span (with its parent and fields) and event (with its span).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Captured>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}").trim_matches('"').to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut captured = self.0.lock().unwrap();
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .and_then(|p| captured.live.get(&p.id().into_u64()).copied());
        let mut record =
            SpanRecord { name: attrs.metadata().name().to_owned(), parent, fields: HashMap::new() };
        attrs.record(&mut Fields(&mut record.fields));
        let index = captured.spans.len();
        captured.spans.push(record);
        captured.live.insert(id.into_u64(), index);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut captured = self.0.lock().unwrap();
        if let Some(&index) = captured.live.get(&id.into_u64()) {
            values.record(&mut Fields(&mut captured.spans[index].fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let mut captured = self.0.lock().unwrap();
        let span =
            ctx.event_span(event).and_then(|s| captured.live.get(&s.id().into_u64()).copied());
        captured.events.push(EventRecord {
            message: fields.remove("message").unwrap_or_default(),
            fields,
            span,
        });
    }
}

#[test]
fn a_call_throttled_once_then_answered_is_one_call_span_over_two_attempt_spans() {
    let server = throttles_once();
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let fetcher = fetcher(paced());
            call(&fetcher, &server.base_url()).await;
        })
    });

    let captured = capture.0.lock().unwrap();
    let calls: Vec<(usize, &SpanRecord)> =
        captured.spans.iter().enumerate().filter(|(_, s)| s.name == "ratebucket.call").collect();
    assert_eq!(calls.len(), 1, "one call span: {:?}", captured.spans);
    let (call_id, call) = calls[0];
    assert_eq!(call.parent, None);
    assert!(call.fields.contains_key("request_id"));
    assert_eq!(call.fields["limiter"], "scripted/api");
    assert_eq!(call.fields["reserved"], "[1, 100]");
    assert_eq!(call.fields["committed"], "[1, 40]");
    assert_eq!(call.fields["attempts"], "2");
    assert_eq!(call.fields["class"], "Ok");

    let mut attempts: Vec<(usize, &SpanRecord)> =
        captured.spans.iter().enumerate().filter(|(_, s)| s.name == "ratebucket.attempt").collect();
    attempts.sort_by_key(|(_, s)| s.fields["attempt"].clone());
    assert_eq!(attempts.len(), 2, "two attempt spans");
    for (n, (_, attempt)) in attempts.iter().enumerate() {
        assert_eq!(attempt.parent, Some(call_id), "attempts nest in the call");
        assert_eq!(attempt.fields["attempt"], n.to_string());
        assert!(attempt.fields.contains_key("wait_ms"), "{attempt:?}");
    }
    assert_eq!(attempts[0].1.fields["class"], "Throttled");
    assert_eq!(attempts[1].1.fields["class"], "Ok");
    // The pause waited out before the second attempt was sent.
    let waited: f64 = attempts[1].1.fields["wait_ms"].parse().expect("a number");
    assert!(waited >= 40.0, "waited {waited} ms for the pause");

    // The pause is announced inside the attempt that was throttled.
    let pauses: Vec<&EventRecord> =
        captured.events.iter().filter(|e| e.message.starts_with("gate closed")).collect();
    assert_eq!(pauses.len(), 1, "{:?}", captured.events);
    assert_eq!(pauses[0].span, Some(attempts[0].0));
    // So is the limit the provider refused it on, with what the provider said of it.
    let refused: Vec<&EventRecord> = captured
        .events
        .iter()
        .filter(|e| e.message.starts_with("the provider refused on"))
        .collect();
    assert_eq!(refused.len(), 1, "{:?}", captured.events);
    let refused = refused[0];
    assert_eq!(refused.span, Some(attempts[0].0));
    assert_eq!(refused.fields["dimension"], "requests");
    assert_eq!(refused.fields["limit"], "Some(1000)");
    assert_eq!(refused.fields["remaining"], "Some(0)");
    assert_eq!(refused.message, "the provider refused on requests (limit 1000, 0 remaining)");
}
